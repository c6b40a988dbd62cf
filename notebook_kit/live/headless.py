"""Text displays for a launch: each worker line prefixed with its rank, compact progress lines
without a notebook, errors only when off.

Without a notebook front end (plain python, a terminal IPython, CI logs) a redrawn bar would
fill logs with carriage returns, so progress is printed as a short line every few seconds.
"""

from __future__ import annotations

import sys
import time

from notebook_kit.live.observer import LaunchInfo, LaunchSummary, Stream, rank_label
from notebook_kit.live.rank_output import last_segment
from notebook_kit.live.record import RunRecorder
from notebook_kit.live.summary import SummaryPanel
from notebook_kit.runtime.messages import MetricsBatch

__all__ = ["ConsolePrinter", "HeadlessObserver", "QuietObserver"]

_LINE_SECONDS = 10.0  # between two progress lines


class ConsolePrinter:
    """Prints worker lines as ``[rank N] text``, each in one write (ranks never mix mid-line)."""

    nodes: dict[int, int] = {}  # noqa: RUF012 (replaced per launch, never mutated)

    def on_start(self, info: LaunchInfo) -> None:
        self.nodes = info.node_of()
        print(info.banner, flush=True)

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        target = sys.stderr if stream == "stderr" else sys.stdout
        target.write(f"[{rank_label(rank, self.nodes)}] {line}\n")

    def on_metrics(self, batch: MetricsBatch) -> None:
        """Metrics have no plain-text form here."""

    def on_tick(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()

    def on_finish(self, summary: LaunchSummary) -> None:
        self.on_tick()


class QuietObserver:
    """``live=False``: nothing but what workers wrote to stderr; the run is still recorded.

    Example::

        notebook_launcher(train, num_processes=2, live=False)
    """

    def __init__(self) -> None:
        self.recorder = RunRecorder()
        self.console = ConsolePrinter()
        self._unflushed = False

    def on_start(self, info: LaunchInfo) -> None:
        """No banner: a quiet run shows nothing unless a worker writes to stderr."""
        self.recorder.start(info)
        self.console.nodes = info.node_of()

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        if stream == "stderr":
            self.console.on_output(rank, stream, last_segment(line))
            self._unflushed = True

    def on_metrics(self, batch: MetricsBatch) -> None:
        self.recorder.on_metrics(batch)

    def on_tick(self) -> None:
        self.recorder.tick()
        # Only when something was written: in a kernel a flush waits for its output thread,
        # and an in-kernel run ticks once per step.
        if self._unflushed:
            self._unflushed = False
            sys.stderr.flush()

    def on_finish(self, summary: LaunchSummary) -> None:
        self.recorder.finish(summary)
        sys.stderr.flush()


class HeadlessObserver(QuietObserver):
    """Worker lines prefixed with their rank, plus a progress line every few seconds.

    Example::

        notebook_launcher(train, num_processes=2, observer=HeadlessObserver())
    """

    def __init__(self, interval: float = _LINE_SECONDS) -> None:
        super().__init__()
        self.interval = interval
        self._started = time.monotonic()
        self._last_line = 0.0
        self._printed_version = -1
        # Its rate clock ticks with the recorder's: the progress lines share the end's rate.
        self._summary_panel = next(p for p in self.recorder.panels if isinstance(p, SummaryPanel))

    def on_start(self, info: LaunchInfo) -> None:
        self.recorder.start(info)
        self.console.on_start(info)
        self._started = self._last_line = time.monotonic()

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        self.console.on_output(rank, stream, last_segment(line))

    def on_tick(self) -> None:
        self.recorder.tick()
        if time.monotonic() - self._last_line >= self.interval:
            self._print_progress()
        self.console.on_tick()

    def _print_progress(self) -> None:
        self._last_line = time.monotonic()
        metrics = self.recorder.metrics
        if metrics.version == self._printed_version and not self.recorder.progress.count:
            return
        self._printed_version = metrics.version
        line = self._summary_panel.progress_line(time.monotonic() - self._started)
        print(f"[progress] {line}", flush=True)

    def on_finish(self, summary: LaunchSummary) -> None:
        self.recorder.finish(summary)
        for _, text in self.recorder.texts("headless"):  # the ending line first
            print(text, flush=True)
        self.console.on_finish(summary)
