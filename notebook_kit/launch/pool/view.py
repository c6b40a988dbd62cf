"""What the kernel shows of one pool run: text grouped by rank, the live view when it lasts.

A cell on a warm pool often takes a few milliseconds, far less than drawing the live view's
widgets, so the live view (the launcher's own observer: Stop button, progress bar, plot) is only
opened once a run has lasted :data:`LIVE_AFTER` seconds, and is then given everything that
arrived before. A run too short for it is still recorded for ``last_run()``.

Worker lines are printed as cell text, grouped by rank under a ``[rank N]`` heading
(``[rank N · node M]`` on a cluster), for ``%%distributed`` cells (``text=True``), or each in
the order it arrived after its ``[rank N]`` label (``interleave=True``); for
``pool.run`` they go to the live view's tabs as in a launch, and are printed grouped at the end
only when no live view was opened.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
import warnings
from typing import Any

from notebook_kit.launch.interrupts import interrupts_deferred
from notebook_kit.live.display import default_observer
from notebook_kit.live.headless import last_segment
from notebook_kit.live.observer import (
    LaunchInfo,
    LaunchObserver,
    LaunchSummary,
    Stream,
    rank_label,
)
from notebook_kit.live.record import RunRecorder
from notebook_kit.runtime.messages import (
    MetricsBatch,
    OutputLine,
    PoolAnswer,
    Started,
    WorkerMessage,
)

__all__ = [
    "LIVE_AFTER",
    "GroupedText",
    "InterleavedText",
    "PoolRelay",
    "RunForward",
    "RunView",
    "interrupt_with",
]


LIVE_AFTER = 0.5  # seconds a run lasts before its live view opens
_TEXT_SECONDS = 0.25  # between two printings of worker lines during a run

_interrupt_request: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "interrupt_request", default=None
)


def interrupt_with(request: threading.Event) -> None:
    """In this context, a run's view ends the run as Ctrl-C would once ``request`` is set.

    A command on a thread of its own (a ``--noblock`` cell) cannot get the kernel's Ctrl-C;
    its view raises the KeyboardInterrupt instead, at its next tick, where the backends take
    one from drawing: the ranks are interrupted and settle as after a press.
    """
    _interrupt_request.set(request)


class RunForward:
    """A pool's observer, local or on a cluster: the workers' lines and metrics go to the run
    being shown (:meth:`attach`); lines printed between runs (a background thread's) are held
    for the next run's view (:meth:`take_held`)."""

    def __init__(self) -> None:
        self.view: LaunchObserver | None = None
        self.held: list[OutputLine] = []

    def attach(self, view: LaunchObserver | None) -> None:
        self.view = view

    def take_held(self) -> list[OutputLine]:
        held, self.held = self.held, []
        return held

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        if self.view is not None:
            self.view.on_output(rank, stream, line)
        else:
            self.held.append(OutputLine(rank, stream, line))

    def on_metrics(self, batch: MetricsBatch) -> None:
        if self.view is not None:
            self.view.on_metrics(batch)

    def on_tick(self) -> None:
        if self.view is not None:
            self.view.on_tick()


class PoolRelay(RunForward):
    """A local pool's supervisor's observer: answers and readiness to the pool, the rest
    forwarded."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[int, PoolAnswer] = {}
        self.ready: set[int] = set()

    def on_start(self, info: Any) -> None:
        """The pool tells each run's view itself."""

    def on_other(self, rank: int, message: WorkerMessage) -> None:
        """The supervisor hands over what a launch does not know: answers and readiness."""
        if isinstance(message, PoolAnswer):
            self.answers[rank] = message
        elif isinstance(message, Started):
            self.ready.add(rank)

    def on_tick(self) -> None:
        """The pool ticks the view itself (:meth:`tick`), outside the part that defers Ctrl-C."""

    def tick(self) -> None:
        super().on_tick()

    def on_finish(self, summary: Any) -> None:
        """The pool tells each run's view itself."""


class GroupedText:
    """Prints worker lines grouped by rank, each group under a ``[rank N]`` heading.

    Lines are collected and printed at each :meth:`flush` (the launcher's tick), every rank's
    lines together, so output of ranks printing at once never interleaves line by line.

    Example:
        >>> text = GroupedText(); text.add(1, "stdout", "b"); text.add(0, "stdout", "a")
        >>> text.flush()
        [rank 0]
        a
        [rank 1]
        b
    """

    def __init__(self, streams: tuple[Stream, ...] = ("stdout", "stderr")) -> None:
        self.streams = streams
        self.nodes: dict[int, int] = {}  # rank -> node, on a cluster: shown in each heading
        self._lines: dict[tuple[int, Stream], list[str]] = {}
        self._last: dict[str, int] = {}  # per stream: a notebook shows each as one block

    def add(self, rank: int, stream: Stream, line: str) -> None:
        if stream in self.streams:
            self._lines.setdefault((rank, stream), []).append(last_segment(line))

    def flush(self) -> None:
        if not self._lines:
            return
        lines, self._lines = self._lines, {}
        for stream in ("stdout", "stderr"):
            text = []
            for (rank, kind), group in sorted(lines.items()):
                if kind != stream:
                    continue
                if self._last.get(stream) != rank:
                    text.append(f"[{rank_label(rank, self.nodes)}]")
                    self._last[stream] = rank
                text.extend(group)
            if text:
                target = sys.stdout if stream == "stdout" else sys.stderr
                target.write("\n".join(text) + "\n")  # one write: one message in a kernel
                target.flush()


class InterleavedText(GroupedText):
    """Prints worker lines in the order they arrived, each after its ``[rank N]`` label.

    Example:
        >>> text = InterleavedText(); text.add(1, "stdout", "b"); text.add(0, "stdout", "a")
        >>> text.flush()
        [rank 1] b
        [rank 0] a
    """

    def __init__(self, streams: tuple[Stream, ...] = ("stdout", "stderr")) -> None:
        super().__init__(streams)
        self._arrived: list[tuple[Stream, str]] = []

    def add(self, rank: int, stream: Stream, line: str) -> None:
        if stream in self.streams:
            label = rank_label(rank, self.nodes)
            self._arrived.append((stream, f"[{label}] {last_segment(line)}"))

    def flush(self) -> None:
        arrived, self._arrived = self._arrived, []
        for stream in ("stdout", "stderr"):
            text = [line for kind, line in arrived if kind == stream]
            if text:
                target = sys.stdout if stream == "stdout" else sys.stderr
                target.write("\n".join(text) + "\n")  # one write: one message in a kernel
                target.flush()


class RunView:
    """The observer of one pool run (see the module docstring).

    Example::

        view = RunView(live=None, text=True); view.on_start(info); ...; view.on_finish(s)
    """

    def __init__(
        self,
        live: bool | None,
        text: bool,
        record: bool = True,
        live_after: float = LIVE_AFTER,
        interleave: bool = False,
    ) -> None:
        self.live = live
        self.record = record
        streams: tuple[Stream, ...] = (
            ("stderr",) if live is False and not text else ("stdout", "stderr")
        )
        self.text = (InterleavedText if interleave else GroupedText)(streams)
        self.text_mode = text
        self.live_after = live_after
        self.info: LaunchInfo | None = None
        self.inner: LaunchObserver | None = None
        self._tried = False
        self._started = time.monotonic()
        self._lines: list[OutputLine] = []
        self._printed = time.monotonic()
        self._batches: list[MetricsBatch] = []
        self._interrupt = _interrupt_request.get()

    def on_start(self, info: LaunchInfo) -> None:
        self.info = info
        self.text.nodes = info.node_of()
        self._started = self._printed = time.monotonic()

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        if self.text_mode:
            self.text.add(rank, stream, line)
        elif self.inner is not None:
            self.inner.on_output(rank, stream, line)
        else:
            self._lines.append(OutputLine(rank, stream, line))

    def on_metrics(self, batch: MetricsBatch) -> None:
        if self.inner is not None:
            self.inner.on_metrics(batch)
        else:
            self._batches.append(batch)

    def on_tick(self) -> None:
        if self._interrupt is not None and self._interrupt.is_set():
            self._interrupt.clear()  # once: the backend settles the run from here
            raise KeyboardInterrupt
        late = time.monotonic() - self._started >= self.live_after
        if self.inner is None and self.record and late and not self._tried:
            self._open_live_view()
        if self.inner is not None:
            self.inner.on_tick()
        if self.text_mode and time.monotonic() - self._printed >= _TEXT_SECONDS:
            self._printed = time.monotonic()
            self.text.flush()

    def on_finish(self, summary: LaunchSummary) -> None:
        if self.inner is not None:
            self.inner.on_finish(summary)
        else:
            if self.record:
                recorder = RunRecorder()
                for batch in self._batches:
                    recorder.on_metrics(batch)
                recorder.finish(summary)
            for line in self._lines:
                self.text.add(line.rank, line.stream, line.text)
        self.text.flush()

    def _open_live_view(self) -> None:
        """Open the live view whole, or not at all (a Ctrl-C waits until it is drawn)."""
        assert self.info is not None
        self._tried = True  # once, whatever happens
        try:
            with interrupts_deferred():
                inner = default_observer(self.live)
                inner.on_start(self.info)
                for line in self._lines:
                    inner.on_output(line.rank, line.stream, line.text)
                for batch in self._batches:
                    inner.on_metrics(batch)
        except Exception as error:  # a display problem must never end the run
            warnings.warn(f"The live view could not be shown: {error!r}", stacklevel=2)
            return
        self.inner = inner
        self._lines, self._batches = [], []
