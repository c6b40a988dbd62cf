"""``TensorBoardTracker``: event files TensorBoard reads, for notebook_kit's ``Accelerator``.

Same name, arguments and folder layout as Accelerate's tracker: ``log_with="tensorboard"``
writes ``<logging_dir>/<project_name>/events.out.tfevents.*`` through torch's own
``SummaryWriter``, which needs the ``tensorboard`` package (``pip install tensorboard``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["TensorBoardTracker"]


class TensorBoardTracker:
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
    main_process_only = True

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
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ImportError(
                'log_with="tensorboard" needs the tensorboard package: pip install tensorboard '
                "(or pip install notebook_kit[tensorboard])."
            ) from error
        self.writer = SummaryWriter(str(self.logging_dir), **self.writer_kwargs)

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
