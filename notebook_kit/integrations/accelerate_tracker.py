"""``LiveViewTracker``: Accelerate's own ``Accelerator`` logs to notebook_kit's live plot.

Importing this module imports ``accelerate``. The tracker follows Accelerate's public
``GeneralTracker`` API, so it is passed like any custom tracker, next to others if wanted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accelerate.tracking import GeneralTracker

from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.metrics import flush, log_from_worker

__all__ = ["LiveViewTracker"]


class LiveViewTracker(GeneralTracker):
    """Sends ``accelerator.log(values, step)`` to the live plot and ``last_run().metrics``.

    Accelerate calls trackers on the main process only, so the plot shows rank 0's values;
    a logged ``step`` also moves the progress bar. Numbers and one-element tensors are
    plotted, a dict of them as ``name/key``; strings are left out. Outside a launch it
    does nothing.

    Example::

        from accelerate import Accelerator
        from notebook_kit.integrations import LiveViewTracker
        accelerator = Accelerator(log_with=LiveViewTracker())
        accelerator.init_trackers("digits")
        accelerator.log({"loss": loss.item()}, step=step)
    """

    name = "notebook_kit"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.config: dict[str, Any] = {}

    @property
    def tracker(self) -> LiveViewTracker:
        return self

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Kept in ``config`` (the live view shows metrics only)."""
        self.config = dict(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        log_from_worker(current_launch(), _numbers(values), step)

    def finish(self) -> None:
        flush(current_launch())


def _numbers(values: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, Mapping):
            flat.update({f"{name}/{key}": item for key, item in _numbers(value).items()})
        elif not isinstance(value, (str, bytes, bool)):
            flat[str(name)] = value  # the channel leaves out what is not a number
    return flat
