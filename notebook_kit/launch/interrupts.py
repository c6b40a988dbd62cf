"""Ctrl-C (SIGINT) in the kernel during a launch: never lost, never delivered half-way.

Python runs a signal handler at the next bytecode of the main thread. During ``os.fork`` that
can be inside an at-fork hook (logging registers one), which discards the KeyboardInterrupt
it raises: the interrupt would be lost and the launch train to the end. So while a fork is
under way an interrupt is only recorded, and delivered once the fork has returned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["forking", "interrupts_deferred", "interrupts_survive_forks"]

_forks_under_way = 0  # > 0 from the first before-fork hook to the last after-fork hook


def _fork_starts() -> None:
    global _forks_under_way
    _forks_under_way += 1


def _fork_ends() -> None:
    global _forks_under_way
    _forks_under_way = max(0, _forks_under_way - 1)


def _in_child() -> None:
    global _forks_under_way
    _forks_under_way = 0


# Registered after logging's hooks (imported long before), so this window encloses theirs
# (before-hooks run last-registered first, after-hooks in order). ``forking`` covers the
# hooks of modules imported later, for the forks the launcher makes itself.
os.register_at_fork(before=_fork_starts, after_in_parent=_fork_ends, after_in_child=_in_child)


@contextlib.contextmanager
def forking() -> Iterator[None]:
    """Mark a fork made here, at-fork hooks included, as under way."""
    _fork_starts()
    try:
        yield
    finally:
        _fork_ends()


Handler = Callable[[int, FrameType | None], Any]


@contextlib.contextmanager
def interrupts_survive_forks() -> Iterator[None]:
    """Within the block, an interrupt that arrives during a fork is delivered after it.

    Any other interrupt goes to the kernel's handler at once, as without the block. The
    handler is put back as it was when the block ends.
    """
    previous = _python_handler()
    if previous is None:  # default action, ignored, or not the main thread: nothing to keep
        yield
        return
    held: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if _forks_under_way:
            held.append(signum)
        else:
            previous(signum, frame)

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:  # the fork is over: deliver it now, where it can propagate
            previous(signal.SIGINT, None)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back Ctrl-C while the workers are being cleaned up, then deliver it once.

    The kernel's SIGINT handler is put back as it was before the block ends.
    """
    previous = _python_handler()
    if previous is None:
        yield
        return
    received: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            previous(signal.SIGINT, None)


def _python_handler() -> Handler | None:
    """The SIGINT handler if it is a Python callable that may be replaced from here."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGINT)
    return handler if callable(handler) else None
