"""One pool command at a time: callers from other threads wait their turn, in order.

A pool's workers read one command from their pipe, run it and answer; the kernel side keeps
one set of answers and one view per command. Two commands sent at once from two kernel threads
(or two asyncio tasks that each run ``pool.run`` in a thread) would interleave their bytes on
the pipes and mix their answers. So every public command takes a turn: the callers of other
threads queue in the order they called, and a call from the thread whose command is still
running (a callback, a signal handler) is refused with an error, since it could only wait for
itself. Each command also holds the kernel's :func:`interrupt_latch`, so two or three presses
of the stop button during it end it with one KeyboardInterrupt.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from notebook_kit.launch.interrupts import interrupt_latch

__all__ = ["Turns", "one_command_at_a_time", "tell_when_in_line"]

Method = TypeVar("Method", bound=Callable[..., Any])

_in_line: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "in_line", default=None
)


def tell_when_in_line(event: threading.Event) -> None:
    """In this context, set ``event`` once a command has its place in a pool's line.

    A command started in the background (a ``--noblock`` cell) waits for it before the cell
    returns, so that the next cell's command comes after it.
    """
    _in_line.set(event)


class Turns:
    """A first-come, first-served turn for one command at a time.

    Example:
        >>> turns = Turns()
        >>> with turns.take("pool.run"):
        ...     pass
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._owner: int | None = None
        self._queue: collections.deque[object] = collections.deque()

    @contextlib.contextmanager
    def take(self, what: str) -> Iterator[None]:
        """Wait until every earlier caller is done, then hold the turn for the block."""
        me = threading.get_ident()
        with self._changed:
            if self._owner == me:
                raise RuntimeError(
                    f"{what} was called while a command of this pool is still running on "
                    "the same thread (from a callback or a signal handler?). A pool runs one "
                    "command at a time: call it once that command has returned."
                )
            ticket = object()
            self._queue.append(ticket)
            queued = _in_line.get()
            if queued is not None:
                queued.set()
            try:
                while self._owner is not None or self._queue[0] is not ticket:
                    self._changed.wait()
            except BaseException:  # interrupted while waiting: leave the queue
                self._queue.remove(ticket)
                self._changed.notify_all()
                raise
            self._queue.popleft()
            self._owner = me
        try:
            yield
        finally:
            with self._changed:
                self._owner = None
                self._changed.notify_all()


def one_command_at_a_time(method: Method) -> Method:
    """Run a ``WorkerPool`` method in the pool's turn and under one interrupt latch."""
    what = f"pool.{method.__name__}"

    @functools.wraps(method)
    def in_turn(self: Any, *args: Any, **kwargs: Any) -> Any:
        if os.getpid() != self._live.pid:  # a copy of the pool in a worker: it says so itself
            return method(self, *args, **kwargs)
        with interrupt_latch(), self._turns.take(what):
            return method(self, *args, **kwargs)

    return in_turn  # type: ignore[return-value]
