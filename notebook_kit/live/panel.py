"""What a figure of the launch view is: a :class:`Panel`, and the :class:`Run` it reads.

A panel is made with the :class:`Run` it reads and follows it (``start`` at each attempt,
``take`` for every typed message a worker sends, ``tick``, ``finish``), and says what it has
to show in each place a run is shown: a line under the plot of the notebook view, lines under
the end-of-run summary (and the saved PNG), lines printed at the end without a notebook, and
what ``last_run()`` keeps. Every hook is optional: a panel overrides only what it has to
say. The recorder (:class:`~notebook_kit.live.record.RunRecorder`) makes one of each class
in its ``PANELS`` list, and every display asks them in that order: a new figure is one
module with its panel and one line in that list.

Example::

    class StepCount(Panel):
        name = "step_count"

        def headless(self):
            return f"[steps] {self.run.progress.count} steps"
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from notebook_kit.live.metrics import MetricsAggregator
from notebook_kit.live.observer import LaunchInfo, LaunchSummary
from notebook_kit.live.progress import ProgressState
from notebook_kit.runtime.messages import WorkerMessage

__all__ = ["Panel", "Run"]


class Run(Protocol):
    """What a panel may read of the run: its shape, every metric, rank 0's progress."""

    @property
    def info(self) -> LaunchInfo | None: ...

    @property
    def metrics(self) -> MetricsAggregator: ...

    @property
    def progress(self) -> ProgressState: ...


class Panel:
    """One figure of the launch view; the defaults say nothing."""

    name: ClassVar[str]  # its key in ``last_run().panels``, and its CSS class ``nk-…``

    def __init__(self, run: Run) -> None:
        self.run = run

    def start(self) -> None:
        """An attempt starts: the first, or a restart after a failure."""

    def take(self, message: WorkerMessage) -> None:
        """A typed message a worker sent (panels pick the classes they care about)."""

    def tick(self) -> None:
        """At least every quarter second while the workers run."""

    def finish(self, summary: LaunchSummary) -> None:
        """Every worker of the attempt ended."""

    def live(self) -> str:
        """Text of its line under the plot in the notebook view now ("": no line yet)."""
        return ""

    def summary(self) -> str:
        """Lines under the end-of-run summary line and the saved plot ("": none)."""
        return ""

    def headless(self) -> str:
        """What a run without a notebook prints of it at the end ("": nothing)."""
        return ""

    def record(self) -> Any:
        """What ``last_run().panels`` keeps of it, under :attr:`name`."""
        return None
