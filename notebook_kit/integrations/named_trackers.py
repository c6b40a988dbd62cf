"""The trackers ``log_with`` names, for notebook_kit's ``Accelerator``: TensorBoard and W&B here,
MLflow in :mod:`~notebook_kit.integrations.mlflow_tracker`; each on :class:`NamedTracker`, with
the names, arguments and file layout of Accelerate's trackers (``wandb sync`` uploads a run
kept on disk with ``WANDB_MODE=offline``).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

__all__ = ["PACKAGES", "NamedTracker", "TensorBoardTracker", "WandBTracker", "install_hint"]

# name -> (the module it imports, the package that provides it, the extra that installs it)
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny", "mlflow"),
}


def install_hint(name: str) -> str:
    """What to install for the tracker ``log_with`` calls ``name``.

    Example:
        >>> install_hint("mlflow")
        'log_with="mlflow" needs the mlflow-skinny package: pip install mlflow-skinny ...'
    """
    _, package, extra = PACKAGES[name]
    return (
        f'log_with="{name}" needs the {package} package: pip install {package} '
        f"(or pip install notebook_kit[{extra}])."
    )


class NamedTracker:
    """What a named tracker shares: Accelerate's ``GeneralTracker`` class attributes, and the
    import of its package at ``start``, which fails with :func:`install_hint`.

    Example::

        class MyTracker(NamedTracker):
            name = "mine"
    """

    name: str
    requires_logging_directory = False
    main_process_only = True  # Accelerate calls trackers on the main process only

    def _package(self, module: str) -> Any:
        try:
            return importlib.import_module(module)
        except ImportError as error:
            raise ImportError(install_hint(self.name)) from error


class TensorBoardTracker(NamedTracker):
    """Writes logged metrics as TensorBoard scalars (and the run's configuration as hparams).

    Args:
        run_name: The folder under ``logging_dir`` (``init_trackers``' ``project_name``).
        logging_dir: Where runs are kept (the Accelerator's ``project_dir`` by default).
        **kwargs: Passed on to ``torch.utils.tensorboard.SummaryWriter`` (e.g. ``flush_secs``).

    Example::

        accelerator = Accelerator(log_with="tensorboard", project_dir="runs")
        accelerator.init_trackers("digits", config={"lr": 0.01})
        accelerator.log({"loss": 0.5}, step=1)  # runs/digits/events.out.tfevents.*
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        self.run_name = run_name
        self.logging_dir = Path(logging_dir) / run_name
        self.writer_kwargs = kwargs
        self.writer: Any = None

    @property
    def tracker(self) -> Any:
        """The ``SummaryWriter`` (after ``start``)."""
        return self.writer

    def start(self) -> None:
        tensorboard = self._package("torch.utils.tensorboard")
        self.writer = tensorboard.SummaryWriter(str(self.logging_dir), **self.writer_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """The run's configuration, shown in TensorBoard's HParams tab."""
        plain = {
            str(key): value if isinstance(value, (bool, int, float, str)) else str(value)
            for key, value in values.items()
        }
        self.writer.add_hparams(plain, metric_dict={}, run_name=".")
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as scalars, strings as text, a dict of numbers as one chart."""
        for name, value in values.items():
            if isinstance(value, str):
                self.writer.add_text(name, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(name, value, global_step=step, **kwargs)
            else:
                self.writer.add_scalar(name, value, global_step=step, **kwargs)
        self.writer.flush()

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()


class WandBTracker(NamedTracker):
    """Logs metrics to a Weights & Biases run.

    Args:
        run_name: The W&B project (``init_trackers``' ``project_name``).
        **kwargs: Passed on to ``wandb.init`` (``name``, ``entity``, ``tags``, ``dir``, ...).

    Example::

        accelerator = Accelerator(log_with="wandb")  # WANDB_MODE=offline: a run on disk
        accelerator.init_trackers("digits", init_kwargs={"wandb": {"entity": "my-team"}})
    """

    name = "wandb"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    @property
    def tracker(self) -> Any:
        """The ``wandb`` run (after ``start``)."""
        return self.run

    def start(self) -> None:
        self.run = self._package("wandb").init(project=self.run_name, **self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """The run's configuration (W&B's config panel)."""
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
