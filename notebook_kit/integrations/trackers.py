"""The trackers of notebook_kit's ``Accelerator``: ``log_with`` checked, then built.

``log_with`` takes Accelerate's forms: a name, a tracker object with Accelerate's
``GeneralTracker`` interface (Accelerate's own trackers too), or a list of them. A named
tracker's package is checked when the Accelerator is made, before any training.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from typing import Any

from notebook_kit.integrations.mlflow_tracker import MLflowTracker
from notebook_kit.integrations.named_trackers import (
    PACKAGES,
    TensorBoardTracker,
    WandBTracker,
    install_hint,
)

__all__ = ["TRACKER_NAMES", "check_log_with", "make_trackers"]

TRACKER_NAMES = ("all", "tensorboard", "wandb", "mlflow")  # "all": the live plot only


def check_log_with(log_with: Any, logging_dir: str | os.PathLike[str] | None) -> list[Any]:
    """``log_with`` as a list, or a ValueError naming what is wrong and the fix.

    Example:
        >>> check_log_with("tensorboard", "runs")
        ['tensorboard']
    """
    if log_with is None:
        return []
    items = (
        list(log_with)
        if isinstance(log_with, Sequence) and not isinstance(log_with, str)
        else [log_with]
    )
    checked = []
    for item in items:
        if _is_tracker(item):
            checked.append(item)
            continue
        name = str(getattr(item, "value", item)).lower()  # Accelerate's LoggerType is an enum
        if name not in TRACKER_NAMES:
            raise ValueError(
                f"log_with={item!r} is not a tracker notebook_kit's Accelerator knows: use one of "
                f"{', '.join(map(repr, TRACKER_NAMES))}, or pass a tracker object (such as "
                f"accelerate.tracking.WandBTracker(...))."
            )
        if name in PACKAGES and importlib.util.find_spec(PACKAGES[name][0]) is None:
            raise ValueError(install_hint(name))
        if name == TensorBoardTracker.name and logging_dir is None:
            raise ValueError(
                f'log_with="{name}" writes files: give the Accelerator a project_dir '
                f"(or ProjectConfiguration(logging_dir=...))."
            )
        checked.append(name)
    return checked


def make_trackers(
    log_with: list[Any],
    project_name: str,
    logging_dir: str | os.PathLike[str] | None,
    init_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Any]:
    """Build and start the trackers of ``log_with`` for one run (``init_trackers``).

    Example:
        >>> make_trackers(["tensorboard"], "digits", "runs")
        [<...TensorBoardTracker object ...>]
    """
    init_kwargs = init_kwargs or {}
    trackers = []
    for item in log_with:
        options = dict(init_kwargs.get(item, {})) if isinstance(item, str) else {}
        if item == "tensorboard":
            assert logging_dir is not None  # check_log_with made sure
            trackers.append(TensorBoardTracker(project_name, logging_dir, **options))
        elif item == "wandb":
            trackers.append(WandBTracker(project_name, **options))
        elif item == "mlflow":
            trackers.append(MLflowTracker(project_name, **options))
        elif _is_tracker(item):
            trackers.append(item)
    for tracker in trackers:
        start = getattr(tracker, "start", None)
        if callable(start):
            start()
    return trackers


def _is_tracker(item: Any) -> bool:
    return not isinstance(item, str) and callable(getattr(item, "log", None))
