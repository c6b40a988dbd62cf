"""Ctrl-C (SIGINT) in the kernel during a launch: never lost, never delivered half-way, once.

Python runs a signal handler at the next bytecode of the main thread. During ``os.fork`` that
can be inside an at-fork hook (logging registers one), which discards the KeyboardInterrupt
it raises: the interrupt would be lost and the launch train to the end. So while a fork is
under way an interrupt is only recorded, and delivered once the fork has returned.

An impatient user presses the stop button two or three times. The first press ends the launch;
the others arrive while it stops its workers, draws its summary, or while IPython is still
printing the KeyboardInterrupt, and each would raise again there: two tracebacks, or (inside
IPython's own traceback printing) none at all, and "Run All" would go on. So a launch holds a
:func:`interrupt_latch`: from the first press to the end of the launch (and for a moment after,
while the cell shows its error) further presses are the same request, repeated, and absorbed.
A cell that catches the KeyboardInterrupt and launches again at once (a sweep that skips to its
next setting) is still within that moment: its new launch absorbs the repeats too, wherever
they land, rather than ending because of a press that was meant for the one before.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = [
    "forking",
    "interrupt_latch",
    "interrupt_taken",
    "interrupts_deferred",
    "interrupts_held",
    "interrupts_survive_forks",
]

# A press this soon after the one delivered is taken as the same press, repeated.
REPEAT_SECONDS = 1.0
_MOVES = 100  # an interrupt is handed on at most this often before it is raised anyway
_MOVE_SECONDS = 0.001  # ... and comes again this much later

_forks_under_way = 0  # > 0 from the first before-fork hook to the last after-fork hook


def _fork_starts() -> None:
    global _forks_under_way
    _forks_under_way += 1


def _fork_ends() -> None:
    global _forks_under_way
    _forks_under_way = max(0, _forks_under_way - 1)


def _in_child() -> None:
    global _forks_under_way, _active
    _forks_under_way = 0
    _active = None


# Registered after logging's hooks (imported long before), so this window encloses theirs
# (before-hooks run last-registered first, after-hooks in order). ``forking`` covers the
# hooks of modules imported later, for the forks the launcher makes itself.
os.register_at_fork(before=_fork_starts, after_in_parent=_fork_ends, after_in_child=_in_child)

Handler = Callable[[int, FrameType | None], Any]


class _Latch:
    """The SIGINT handler of one launch: delivers the first press, absorbs its repeats."""

    def __init__(self, previous: Handler, repeats_until: float = 0.0) -> None:
        self.previous = previous
        self.holding = 0  # sections open that must not be cut (a fork, the clean-up)
        self.pending = False  # a press arrived in such a section, not delivered yet
        self.repeats_until = repeats_until  # presses until then repeat one delivered
        self.taken = False  # the launch caught the interrupt and is ending because of it
        self.moved = 0  # presses handed on from an instruction without a line

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.repeated():
            return
        if self.holding or _forks_under_way:
            self.pending = True
            return
        if _unformattable(frame) and self.moved < _MOVES:
            # CPython stopped on an instruction it gives no line (a loop's own jump), and
            # IPython cannot format a traceback through such a frame: it shows "Unexpected
            # exception formatting exception" instead. The press comes again a moment later,
            # once this frame has moved on (posted now, it would be raised in this handler,
            # with that frame still below it). The thread that posts it is started without
            # waiting for it to run, and a press that comes back while this handler still
            # runs is handed on again, so none is raised in here.
            self.moved += 1
            _thread.start_new_thread(_press_again, ())
            return
        self.deliver(frame)

    def repeated(self) -> bool:
        """True while a press would only repeat one already delivered."""
        return self.taken or time.monotonic() < self.repeats_until

    def deliver(self, frame: FrameType | None = None) -> None:
        """Hand the press to the kernel's handler (which raises KeyboardInterrupt)."""
        self.pending = False
        self.repeats_until = time.monotonic() + REPEAT_SECONDS
        self.previous(signal.SIGINT, frame)

    def deliver_pending(self) -> None:
        """At the end of a section that held a press back: raise it now, where it can go."""
        if self.pending and not self.holding and not _forks_under_way:
            self.deliver()


def _unformattable(frame: FrameType | None) -> bool:
    """True for a frame a traceback cannot be shown through: one stopped on an instruction
    without a line, or the latch's own handler (a press handed on came back inside it)."""
    return frame is not None and (frame.f_lineno is None or frame.f_code is _HANDLE_CODE)


def _press_again() -> None:
    time.sleep(_MOVE_SECONDS)
    _thread.interrupt_main(signal.SIGINT)


_HANDLE_CODE = _Latch.handle.__code__
_active: _Latch | None = None


@contextlib.contextmanager
def interrupt_latch() -> Iterator[None]:
    """Within the block (one launch, one pool command), Ctrl-C raises at most once.

    The first press raises KeyboardInterrupt at once (or, inside a fork or a clean-up, when
    that ends); later ones are absorbed until the block ends. A KeyboardInterrupt leaving the
    block keeps absorbing presses for :data:`REPEAT_SECONDS` in IPython, while the cell shows
    its error, then the kernel's handler is back; a block entered meanwhile absorbs them too.
    Nested blocks share the outermost latch.
    """
    global _active
    previous = _python_handler()
    if previous is None or _active is not None:
        yield
        return
    # An earlier launch's afterglow, in the same cell: its repeats go on being absorbed.
    latch = _Latch(getattr(previous, "original", previous), getattr(previous, "until", 0.0))
    previous = latch.previous
    _active = latch
    signal.signal(signal.SIGINT, latch.handle)
    try:
        yield
        latch.deliver_pending()
    except KeyboardInterrupt:
        _active = None
        _afterglow(previous)
        raise
    finally:
        if _active is latch:
            _active = None
            signal.signal(signal.SIGINT, previous)


def interrupt_taken() -> None:
    """The launch caught the interrupt and is ending because of it: absorb every repeat."""
    latch = _latch_here()
    if latch is not None:
        latch.taken = True


def _latch_here() -> _Latch | None:
    """The active latch, for code on the main thread (where the kernel's Ctrl-C lands) only.

    A pool command from another thread holds no press back: none would reach it.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    return _active


def _afterglow(original: Handler) -> None:
    """Absorb repeats while IPython prints the cell's KeyboardInterrupt and sends its reply.

    The kernel puts its own handler back once the request ends; a press that lands between
    the end of the cell's code and its reply would otherwise be raised in the kernel's
    message handler, and the cell would get no reply at all. Outside IPython the handler
    is put back at once: a script's traceback needs no shield.
    """
    if _ipython() is None:
        signal.signal(signal.SIGINT, original)
        return
    until = time.monotonic() + REPEAT_SECONDS

    def absorb(signum: int, frame: FrameType | None) -> None:
        if time.monotonic() >= until:
            original(signum, frame)

    absorb.original = original  # type: ignore[attr-defined]
    absorb.until = until  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, absorb)


def _ipython() -> Any:
    module = sys.modules.get("IPython")
    get = getattr(module, "get_ipython", None)
    shell = get() if get is not None else None
    return shell if hasattr(shell, "events") else None


@contextlib.contextmanager
def forking() -> Iterator[None]:
    """Mark a fork made here, at-fork hooks included, as under way."""
    _fork_starts()
    try:
        yield
    finally:
        _fork_ends()
    latch = _latch_here()
    if latch is not None:
        latch.deliver_pending()


@contextlib.contextmanager
def interrupts_survive_forks() -> Iterator[None]:
    """Within the block, an interrupt that arrives during a fork is delivered after it.

    Any other interrupt goes to the kernel's handler at once, as without the block. The
    handler is put back as it was when the block ends.
    """
    latch = _latch_here()
    if latch is not None:  # the launch's latch holds presses during forks already
        yield
        latch.deliver_pending()
        return
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


class Held:
    """What :func:`interrupts_held` saw: ``pressed`` once Ctrl-C arrived during the block."""

    pressed = False


@contextlib.contextmanager
def interrupts_held() -> Iterator[Held]:
    """Hold Ctrl-C back during the block and report it instead of raising it.

    The caller ends with one KeyboardInterrupt of its own when ``pressed`` (after drawing
    what it must), so the press counts as taken: its repeats are absorbed.
    """
    held = Held()
    latch = _latch_here()
    if latch is None:
        with _recording() as (received, _):
            yield held
        held.pressed = bool(received)
        return
    latch.holding += 1
    try:
        yield held
    finally:
        latch.holding -= 1
        if latch.pending:
            latch.pending, latch.taken, held.pressed = False, True, True


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back Ctrl-C while the workers are being cleaned up, then deliver it once.

    The kernel's SIGINT handler is put back as it was before the block ends.
    """
    latch = _latch_here()
    if latch is None:
        with _recording() as (received, previous):
            yield
        if received and previous is not None:
            previous(signal.SIGINT, None)
        return
    latch.holding += 1
    try:
        yield
    finally:
        latch.holding -= 1
    latch.deliver_pending()


@contextlib.contextmanager
def _recording() -> Iterator[tuple[list[int], Handler | None]]:
    """Without a latch: replace the handler by one that only records presses."""
    received: list[int] = []
    previous = _python_handler()
    if previous is None:
        yield received, None
        return
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield received, previous
    finally:
        signal.signal(signal.SIGINT, previous)


def _python_handler() -> Handler | None:
    """The SIGINT handler if it is a Python callable that may be replaced from here."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGINT)
    return handler if callable(handler) else None
