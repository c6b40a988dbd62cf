"""What a finished run leaves behind in the kernel: :func:`last_run`.

Every display the launcher picks by default (live, headless, or ``live=False``) records the
run the same way, so ``last_run()`` works whichever was shown.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from notebook_kit.errors import choose_root_cause
from notebook_kit.live.eval_table import EvalTablePanel
from notebook_kit.live.metrics import MetricsAggregator
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, RankSummary, Stream
from notebook_kit.live.panels import Panel
from notebook_kit.live.plot_widget import LivePlot
from notebook_kit.live.profile_panel import ProfilePanel
from notebook_kit.live.progress import ProgressState
from notebook_kit.live.progress_bar import ProgressPanel, StatusPanel
from notebook_kit.live.rank_output import RankOutputPanel
from notebook_kit.live.speed import Speed, SpeedPanel
from notebook_kit.live.stacks_panel import StacksPanel
from notebook_kit.live.stop_button import StopPanel
from notebook_kit.live.summary import SummaryPanel
from notebook_kit.runtime.messages import MetricsBatch, OutputLine

__all__ = ["PANELS", "Attempt", "RunRecord", "RunRecorder", "last_run"]

# Every figure of the view, in the order the displays show them (live/panels.py says how).
PANELS: tuple[type[Panel], ...] = (
    SummaryPanel,
    StatusPanel,
    StopPanel,
    ProgressPanel,
    LivePlot,
    SpeedPanel,
    EvalTablePanel,
    StacksPanel,
    ProfilePanel,
    RankOutputPanel,
)


@dataclass(frozen=True)
class Attempt:
    """One attempt of a launch; with ``max_restarts``, a failure starts the next one.

    Attributes:
        world_size: Ranks it ran (it may change between the attempts of a cluster run).
        nodes: Machines it ran on.
        first_step: The first step it logged (where it resumed), None if it logged none.
        duration: Seconds from its start to its end.
        outcome: ``"success"``, ``"stopped"`` or ``"failed"``.
        failure: What ended it, one line naming the rank (and node), None unless it failed.

    Example::

        [(a.world_size, a.outcome) for a in last_run().attempts]
        # [(4, 'failed'), (2, 'success')]
    """

    world_size: int
    nodes: int
    first_step: int | None
    duration: float
    outcome: str
    failure: str | None = None


@dataclass(frozen=True)
class RunRecord:
    """One finished launch, as seen from the kernel.

    Attributes:
        metrics: Per metric, ``(step, mean over ranks)`` in step order.
        rank_metrics: Per rank, per metric, ``(step, value)`` as that rank logged it.
        ranks: Exit code and duration of every local rank.
        duration: Seconds from the first fork to the end.
        stopped: The Stop button (or ``stop_flag.set()``) ended the run.
        succeeded: Every rank finished without error, timeout or interrupt.
        steps: Training steps counted by the progress bar.
        dropped: Metric records the workers could not send (the kernel was too slow).
        attempts: Every attempt, in order (one unless the launch restarted).
        panels: What each figure of the view kept, by its name (``speed`` and ``figure``
            below).

    Example::

        steps, losses = zip(*last_run().metrics["loss"])
    """

    metrics: dict[str, list[tuple[int, float]]]
    rank_metrics: dict[int, dict[str, list[tuple[int, float]]]]
    ranks: tuple[RankSummary, ...]
    duration: float
    stopped: bool
    succeeded: bool
    steps: int = 0
    dropped: int = 0
    attempts: tuple[Attempt, ...] = ()
    panels: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def speed(self) -> Speed | None:
        """The run's :class:`~notebook_kit.live.speed.Speed`, None if no rank counted or logged."""
        return self.panels.get("speed")

    @property
    def profile(self) -> Any:
        """The last ``notebook_kit.profile()`` or Profile button of the run, ``{rank:
        ProfileResult}`` (trace path, top operators, timeline); None if none was taken."""
        return self.panels.get("profile")

    @property
    def figure(self) -> Any:
        """The final live plot (a matplotlib Figure), or None when none was drawn."""
        return self.panels.get("plot")

    @property
    def exit_codes(self) -> dict[int, int | None]:
        return {summary.rank: summary.exit_code for summary in self.ranks}

    @property
    def durations(self) -> dict[int, float]:
        return {summary.rank: summary.duration for summary in self.ranks}


_last: RunRecord | None = None


def last_run() -> RunRecord | None:
    """The record of the most recent launch in this kernel (None before the first).

    Example::

        notebook_launcher(train, num_processes=2)
        record = notebook_kit.last_run()
        record.metrics["loss"][-1], record.stopped
        # ((99, 0.13), False)
    """
    return _last


class RunRecorder:
    """The part shared by every default display: collect metrics and progress, keep a record.

    Example::

        recorder = RunRecorder(); recorder.on_metrics(batch)
    """

    def __init__(self) -> None:
        self.metrics = MetricsAggregator()
        self.progress = ProgressState()
        self.attempts: list[Attempt] = []
        self.restarts: list[tuple[int, str]] = []  # (step it resumed at, label) per restart
        self._info: LaunchInfo | None = None
        self.plot: Any = None  # the live view's plot, where one is drawn (the table reads it)
        self.panels = [make() for make in PANELS]
        for panel in self.panels:
            panel.run = self
        self._started = time.monotonic()
        self._first_step: int | None = None
        self._counted = 0

    def start(self, info: LaunchInfo) -> None:
        """An attempt starts: the first, or a restart after a failure."""
        self._info, self._started, self._first_step = info, time.monotonic(), None
        self._counted = 0  # the attempt's first count from rank 0, once one is seen
        if self.attempts:  # a restart counts from zero: its steps are added once it resumes
            self.progress.steps = 0
        for panel in self.panels:
            panel.start(info)

    def on_metrics(self, batch: MetricsBatch) -> int | None:
        """Take a batch's metrics and progress.

        The first steps a restarted attempt logs replace what earlier attempts logged from
        there on (it resumed from a checkpoint): returns that step, once, else None.
        """
        resumed = None
        if not self._counted and batch.rank == 0 and batch.progress is not None:
            self._counted = batch.progress.steps or 0
        if self._first_step is None:
            steps = [step for _, step, _ in batch.records if step is not None]
            if steps:
                self._first_step = min(steps)
                if self.progress.first_logged is None:
                    self.progress.first_logged = self._first_step
                if self.attempts:
                    resumed = self._first_step
                    self.progress.resume_at(resumed, max(steps), self._counted)
                    self.metrics.drop_from(resumed)
                    world = self._info.world_size if self._info is not None else 0
                    self.restarts.append((resumed, f"restart {len(self.attempts)} · {world} ranks"))
        self.metrics.add_batch(batch)
        self.progress.take_batch(batch)
        for panel in self.panels:
            panel.take(batch)
        return resumed

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        """A line a worker printed (the notebook view shows them; the text views print them)."""
        message = OutputLine(rank, stream, line)
        for panel in self.panels:
            panel.take(message)

    def tick(self) -> None:
        for panel in self.panels:
            panel.tick()

    def texts(self, place: str) -> list[tuple[str, str]]:
        """``(name, text)`` of each panel with something to show in ``place``: ``"live"``,
        ``"summary"`` or ``"headless"`` (a :class:`~notebook_kit.live.panels.Panel` hook)."""
        texts = [(panel.name, getattr(panel, place)()) for panel in self.panels]
        return [(name, text) for name, text in texts if text]

    def finish(self, summary: LaunchSummary) -> RunRecord:
        global _last
        info = self._info
        for panel in self.panels:
            panel.finish(summary)
        # The root cause, as the summary line and the WorkerError name it.
        first = choose_root_cause(list(summary.failures)) if summary.failures else None
        failure = f"rank {first.rank}: {first.summary()}" if first is not None else None
        nodes = set(info.rank_nodes) if info is not None else set()
        self.attempts.append(
            Attempt(
                world_size=info.world_size if info is not None else len(summary.ranks),
                nodes=max(len(nodes), 1),  # no rank_nodes: every rank on this machine
                first_step=self._first_step,
                duration=time.monotonic() - self._started,
                outcome=summary.outcome,
                failure=failure,
            )
        )
        _last = RunRecord(
            metrics=self.metrics.histories(),
            rank_metrics=self.metrics.rank_histories(),
            ranks=summary.ranks,
            duration=summary.duration,
            stopped=summary.stopped,
            succeeded=summary.succeeded,
            steps=self.progress.count,
            dropped=self.metrics.total_dropped,
            attempts=tuple(self.attempts),
            panels={panel.name: panel.record() for panel in self.panels},
        )
        return _last
