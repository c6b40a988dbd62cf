"""Text displays for a launch: each worker line prefixed with its rank, compact progress lines
without a notebook, errors only when off. With more than
:data:`~notebook_kit.live.rank_groups.GROUPED_ABOVE` ranks, the lines ranks print alike within
a second are printed once, naming the ranks (``[ranks 0–511] epoch 3``).

Without a notebook front end (plain python, a terminal IPython, CI logs) a redrawn bar would
fill logs with carriage returns, so progress is printed as a short line every few seconds.
"""

from __future__ import annotations

import sys
import time

from notebook_kit.live.observer import LaunchInfo, LaunchSummary, Stream, rank_label
from notebook_kit.live.rank_groups import GROUPED_ABOVE, ranks_label
from notebook_kit.live.rank_output import last_segment
from notebook_kit.live.record import RunRecorder
from notebook_kit.live.summary import SummaryPanel
from notebook_kit.runtime.messages import MetricsBatch

__all__ = ["ConsolePrinter", "HeadlessObserver", "QuietObserver"]

_LINE_SECONDS = 10.0  # between two progress lines
HOLD_SECONDS = 1.0  # a line many ranks print waits this long for the others' copies


class ConsolePrinter:
    """Prints worker lines as ``[rank N] text``, each in one write (ranks never mix mid-line).

    With many ranks a line is held for :data:`HOLD_SECONDS` from its first copy, and printed
    once for every rank that printed it meanwhile, in the order the lines first came.
    """

    nodes: dict[int, int] = {}  # noqa: RUF012 (replaced per launch, never mutated)
    grouped = False

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], tuple[float, list[int]]] = {}

    def on_start(self, info: LaunchInfo) -> None:
        self.nodes = info.node_of()
        self.grouped = len(info.ranks) > GROUPED_ABOVE
        print(info.banner, flush=True)

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        if self.grouped:
            held = self._held.get((stream, line))
            if held is None:
                self._held[(stream, line)] = (time.monotonic(), [rank])
            else:
                held[1].append(rank)
            return
        target = sys.stderr if stream == "stderr" else sys.stdout
        target.write(f"[{rank_label(rank, self.nodes)}] {line}\n")

    def release(self, older_than: float = HOLD_SECONDS) -> None:
        """Print the held lines whose first copy came ``older_than`` seconds ago or more."""
        now = time.monotonic()
        for key, (first, ranks) in list(self._held.items()):
            if now - first < older_than:
                break  # held in the order they came: the rest are newer
            del self._held[key]
            stream, line = key
            target = sys.stderr if stream == "stderr" else sys.stdout
            who = rank_label(ranks[0], self.nodes) if len(ranks) == 1 else ranks_label(ranks)
            again = f" ({len(ranks)} times)" if len(ranks) > len(set(ranks)) else ""
            target.write(f"[{who}] {line}{again}\n")

    @property
    def holding(self) -> bool:
        """Some lines wait for their copies from other ranks."""
        return bool(self._held)

    def on_metrics(self, batch: MetricsBatch) -> None:
        """Metrics have no plain-text form here."""

    def on_tick(self) -> None:
        if self._held:
            self.release()
        sys.stdout.flush()
        sys.stderr.flush()

    def on_finish(self, summary: LaunchSummary) -> None:
        self.release(older_than=0.0)
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
        self.console.grouped = len(info.ranks) > GROUPED_ABOVE

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        self.recorder.on_output(rank, stream, line)  # kept in last_run().panels["output"]
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
            self.console.on_tick()
            self._unflushed = self.console.holding  # held lines: print them at a later tick

    def on_finish(self, summary: LaunchSummary) -> None:
        self.recorder.finish(summary)
        self.console.on_finish(summary)


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
        self.recorder.on_output(rank, stream, line)
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
