"""Profiling the next steps of a running rank, asked from the kernel: ``notebook_kit.profile()``.

The kernel writes a :class:`~notebook_kit.runtime.messages.ProfileOrder` (a request number and
N) where this worker looks for it (:func:`order_path`, a folder only this user can write) and
sends :data:`PROFILE_SIGNAL`. A small thread waiting in ``sigwait`` reads the order and puts a
:class:`StepProfile` in the slot of the rank's step clock; that is all it does, so the steps
run untouched until then and the only cost of profiling off is the clock reading its slot at
each step boundary. At the next boundary the training thread itself starts
``torch.profiler`` (CUDA activity too on a GPU rank), marks each step as ``ProfilerStep#k``
as torch's own step marks are, and after N steps stops, writes ``profile_<rank>.json`` (a
Chrome trace) in the order's folder and sends a
:class:`~notebook_kit.runtime.messages.ProfileDone` with the top operators and the steps'
timeline. Nothing here may fail the training step: an error is sent home instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from notebook_kit.atomic_file import replace_atomically
from notebook_kit.runtime import codec
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.messages import ProfileDone, ProfileOrder, Send
from notebook_kit.runtime.step_clock import StepClock

__all__ = [
    "PROFILE_SIGNAL",
    "StepProfile",
    "answer_profile_requests",
    "order_path",
    "read_order",
    "write_order",
]

# A real-time signal beside the stacks' one (SIGRTMIN + 6); nothing installs it by default.
PROFILE_SIGNAL: int = signal.SIGRTMIN + 7
TOP_OPERATORS = 10
_TIMELINE_SPANS = 300  # the longest operators drawn on the timeline: the PNG stays small
_ORDER_KINDS = codec.kinds_of(ProfileOrder)
_METRICS = "metrics"  # where runtime.metrics keeps a launch's channel (and its step clock)


def order_path(pid: int) -> Path:
    """Where the kernel leaves the order for worker ``pid``: a folder only this user writes."""
    return Path(tempfile.gettempdir()) / f"notebook_kit-{os.getuid()}" / "profile-orders" / str(pid)


def write_order(pid: int, order: ProfileOrder) -> None:
    """Kernel side: leave ``order`` for worker ``pid`` (read when the signal comes)."""
    path = order_path(pid)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = codec.encode(order, _ORDER_KINDS)
    replace_atomically(path, lambda file: file.write(data))


def read_order(pid: int) -> ProfileOrder | None:
    """The order left for ``pid`` (taken: the file goes), None if none is there or it is not
    this user's."""
    path = order_path(pid)
    try:
        if path.parent.stat().st_uid != os.getuid():
            return None
        data = path.read_bytes()
        path.unlink()
        return codec.decode(data, _ORDER_KINDS, ProfileOrder)
    except (OSError, codec.ProtocolError):
        return None


def answer_profile_requests(send: Send) -> None:
    """Block :data:`PROFILE_SIGNAL` here (threads started later inherit it) and answer it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {PROFILE_SIGNAL})
    thread = threading.Thread(target=_serve, args=(send,), name="notebook_kit-profile", daemon=True)
    thread.start()


def _serve(send: Send) -> None:
    while True:
        signal.sigwait({PROFILE_SIGNAL})
        order = read_order(os.getpid())
        if order is not None:
            with contextlib.suppress(Exception):  # the kernel went away: nothing to tell
                _arm(order, send)


def _arm(order: ProfileOrder, send: Send) -> None:
    """Put ``order`` in the slot of this rank's step clock, once the function has one."""
    deadline = time.monotonic() + order.seconds
    while (found := _running_clock()) is None:
        if time.monotonic() > deadline:
            why = "no step began (a prepared loader's batch, log(samples=...), a backward)"
            send(ProfileDone(order.number, error=why))
            return
        if signal.sigtimedwait({PROFILE_SIGNAL}, 0.05) is not None:  # a newer order
            order = read_order(os.getpid()) or order
            deadline = time.monotonic() + order.seconds
    clock, rank = found
    if order.steps == 0:  # the kernel gave up waiting: stop at the next boundary
        if clock.profiling is not None:
            clock.profiling.cancelled = True
        return
    while (current := clock.profiling) is not None and current.cancelled:  # ends at a step
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if clock.profiling is not None:
        send(ProfileDone(order.number, error="a profile of this rank is still in progress"))
        return
    clock.profiling = StepProfile(order, rank, send, clock.cuda)


def _running_clock() -> tuple[StepClock, int] | None:
    """This rank's step clock and rank, once the running function counted a step."""
    context = current_launch()
    channel = context.extensions.get(_METRICS) if context is not None else None
    return (channel.speed.clock, context.rank) if channel is not None else None  # type: ignore[union-attr]


class StepProfile:
    """One order, carried out on the training thread at the step clock's boundaries."""

    def __init__(self, order: ProfileOrder, rank: int, send: Send, cuda: bool) -> None:
        self.order, self.rank, self.send, self.cuda = order, rank, send, cuda
        self.cancelled = False  # set by the signal thread; acted on at the next boundary
        self.done = 0  # steps profiled so far
        self._profiler: Any = None
        self._marker: Any = None  # the running step's ProfilerStep#k mark

    def boundary(self, clock: StepClock, ended: bool, begins: bool) -> None:
        """A step boundary of the training thread: a step ``ended``, another ``begins``."""
        try:
            self._boundary(ended, begins)
        except Exception as error:  # never the training step's failure
            self._close()
            self._send(ProfileDone(self.order.number, error=f"{type(error).__name__}: {error}"))
        if self._profiler is None and (self.cancelled or self.done):
            clock.profiling = None

    def _boundary(self, ended: bool, begins: bool) -> None:
        if self.cancelled:
            self._close()
            return
        if self._profiler is None:
            if begins:
                self._start()
            return
        if ended:
            self._close_marker()
            self.done += 1
            if self.done >= self.order.steps:
                self._finish()
                return
        if begins:
            self._open_marker()

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._profiler = profile(activities=activities)
        self._profiler.start()
        self._open_marker()

    def _open_marker(self) -> None:
        from torch.autograd.profiler import record_function

        self._marker = record_function(f"ProfilerStep#{self.done}")
        self._marker.__enter__()

    def _close_marker(self) -> None:
        marker, self._marker = self._marker, None
        if marker is not None:
            marker.__exit__(None, None, None)

    def _close(self) -> None:
        """Stop recording and forget it (cancelled, or it failed)."""
        profiler, self._profiler = self._profiler, None
        self._close_marker()
        if profiler is not None:
            with contextlib.suppress(Exception):
                profiler.stop()

    def _finish(self) -> None:
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        folder = Path(self.order.folder)
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / f"profile_{self.rank}.json"
        profiler.export_chrome_trace(str(trace))
        steps, spans = timeline(profiler.events())
        table = top_operators(profiler.key_averages())
        self._send(ProfileDone(self.order.number, self.done, str(trace), table, steps, spans))

    def _send(self, message: ProfileDone) -> None:
        with contextlib.suppress(Exception):  # the kernel went away: nothing to tell
            self.send(message)


def top_operators(averages: Any) -> tuple[tuple[str, int, float, float], ...]:
    """``(name, calls, self CPU ms, total CPU ms)`` of the operators with the most self CPU
    time (the step marks, ``ProfilerStep*`` once torch groups them, left out: they hold
    everything)."""
    rows = [a for a in averages if not a.key.startswith("ProfilerStep")]
    rows.sort(key=lambda a: a.self_cpu_time_total, reverse=True)
    return tuple(
        (a.key, int(a.count), a.self_cpu_time_total / 1000, a.cpu_time_total / 1000)
        for a in rows[:TOP_OPERATORS]
    )


def timeline(
    events: Any,
) -> tuple[tuple[tuple[float, float], ...], tuple[tuple[str, float, float], ...]]:
    """Each profiled step's ``(start, end)`` and the operators run directly in a step,
    ``(name, start, end)``, in milliseconds from the first step's start."""
    marks = sorted(
        (e for e in events if e.name.startswith("ProfilerStep")), key=lambda e: e.time_range.start
    )
    if not marks:
        return (), ()
    origin = marks[0].time_range.start
    ids = {id(mark) for mark in marks}
    tops = [e for e in events if e.cpu_parent is not None and id(e.cpu_parent) in ids]
    tops.sort(key=lambda e: e.time_range.end - e.time_range.start, reverse=True)
    spans = tuple(
        (e.name, (e.time_range.start - origin) / 1000, (e.time_range.end - origin) / 1000)
        for e in tops[:_TIMELINE_SPANS]
    )
    steps = tuple(
        ((m.time_range.start - origin) / 1000, (m.time_range.end - origin) / 1000) for m in marks
    )
    return steps, spans
