"""The kernel's side of a rank's pdb: its prompts asked in the cell, one rank at a time.

A rank at a ``breakpoint()`` (:mod:`notebook_kit.worker.debugger`) sends what pdb printed and
its prompt; the supervisor's loop hands it to the :class:`DebuggerDesk`, which prints the
output and asks ``input(prompt)`` on the kernel's main thread: in a notebook that is the
kernel's own input request, the box an ``input()`` in a cell opens. The line goes back to that
rank's answer pipe (a rank on a cluster's node: its node process's, through the node relay).
Where nobody can type (a frontend that allows no input, a script without a terminal) the answer
is "no line", and the rank skips its breakpoint.

One rank holds the prompt until it continues or quits (or runs on for a while after a step:
it may be waiting in a collective for a rank that is queued here). Ranks that stop meanwhile
wait in order, each named once: "rank 0 is also at a breakpoint, next".
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable

from notebook_kit.runtime.messages import DebuggerLeft, DebuggerLine, DebuggerPrompt

__all__ = ["DebuggerDesk", "ask_the_cell", "can_type"]

# A rank that holds the prompt and has run this long since its last line (a step into code
# that waits for a queued rank) lets the next rank have it.
HAND_OVER_SECONDS = 1.0

Ask = Callable[[str, str], "str | None"]
Answer = Callable[[int, DebuggerLine], None]


def ask_the_cell(output: str, prompt: str) -> str | None:
    """``output`` printed, then ``input(prompt)``, where someone can type; None where nobody can.

    In a kernel, ``input`` is the kernel's: it raises ``StdinNotImplementedError`` when the
    frontend allows no input (asked first, so pdb's output is not shown for a skipped
    breakpoint); elsewhere only a terminal can answer. End of input (Ctrl-D) reads as pdb's
    own end of file, which quits.
    """
    if not can_type():
        return None
    if output:
        _print(output)
    try:
        return input(prompt)
    except EOFError:
        return "EOF"
    except Exception as error:
        if type(error).__name__ == "StdinNotImplementedError":
            return None
        raise


def why_nobody_types() -> str:
    """Why :func:`ask_the_cell` found nobody to ask, in the words of a skipped breakpoint."""
    if not inspect.isbuiltin(builtins.input):
        return "this frontend allows no input"
    return "no cell or terminal can answer here (a script without one)"


def can_type() -> bool:
    """Whether a line can be asked here: a kernel whose frontend allows input, or a terminal."""
    if not inspect.isbuiltin(builtins.input):  # the kernel's, during a cell
        shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
        kernel = getattr(shell, "kernel", None)
        return bool(getattr(kernel, "_allow_stdin", True))
    with contextlib.suppress(Exception):  # a terminal's foreground job: a background one
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()  # would be stopped reading
    return False


class DebuggerDesk:
    """Prompts of the ranks in pdb, answered one at a time by :meth:`turn`.

    Example::

        desk = DebuggerDesk()
        desk.receive(prompt)                # a DebuggerPrompt or DebuggerLeft from a rank
        desk.turn(lambda rank, line: ...)   # asks in the cell, sends the line back
    """

    def __init__(
        self,
        ask: Ask = ask_the_cell,
        say: Callable[[str], None] | None = None,
        why: Callable[[], str] = why_nobody_types,
    ) -> None:
        self.ask = ask
        self.say = say or _print
        self.why = why  # asked when nobody could answer, for the rank's skip line
        self.waiting: dict[int, DebuggerPrompt] = {}  # in the order the ranks stopped
        self.holder: int | None = None  # the rank whose prompt was asked last
        self.answered = 0.0  # when the holder got its last line
        self.named: set[int] = set()  # queued ranks already named in the cell
        self._asking = threading.Lock()  # one prompt at a time, whichever thread turns

    def ranks(self) -> set[int]:
        """The ranks in pdb now: the one asked last and those waiting for their turn."""
        return set(self.waiting) | ({self.holder} if self.holder is not None else set())

    def receive(self, message: DebuggerPrompt | DebuggerLeft) -> None:
        """A rank's prompt (queued) or its leaving pdb (its last output shown)."""
        if isinstance(message, DebuggerLeft):
            if message.output:
                self.say(message.output)
            self.forget(message.rank)
            return
        self.waiting[message.rank] = message
        if self.holder is not None and (names := self._queued_names()):
            self.say(names)  # someone types at the holder's prompt: say who waits

    def forget(self, rank: int) -> None:
        """``rank`` left pdb or died: it neither holds nor waits for the prompt."""
        self.waiting.pop(rank, None)
        self.named.discard(rank)
        if self.holder == rank:
            self.holder = None

    def turn(self, answer: Answer) -> float:
        """Ask the next prompt in the cell and ``answer`` its rank; the seconds it took.

        Ctrl-C at the prompt tells the rank it was interrupted, then ends the wait here.
        """
        if not self._asking.acquire(blocking=False):
            return 0.0
        try:
            return self._ask_next(answer)
        finally:
            self._asking.release()

    def _ask_next(self, answer: Answer) -> float:
        rank = self._next()
        if rank is None:
            return 0.0
        prompt = self.waiting.pop(rank)
        self.named.discard(rank)
        holder, self.holder = self.holder, rank
        started = time.monotonic()
        try:
            text = self.ask(prompt.output + self._queued_names(), prompt.prompt)
        except KeyboardInterrupt:
            self.forget(rank)
            answer(rank, DebuggerLine(None, interrupted=True))
            raise
        answer(rank, DebuggerLine(text, why=self.why() if text is None else ""))
        if text is None:  # nobody can type: the rank skips its breakpoint
            self.holder = holder
            self.named.clear()
        self.answered = time.monotonic()
        return self.answered - started

    def _next(self) -> int | None:
        if not self.waiting:
            return None
        if self.holder in self.waiting:
            return self.holder
        if self.holder is None or time.monotonic() - self.answered >= HAND_OVER_SECONDS:
            return next(iter(self.waiting))
        return None

    def _queued_names(self) -> str:
        """A line, once, for each rank that waits while another holds the prompt."""
        lines = ""
        for rank in self.waiting:
            if rank != self.holder and rank not in self.named:
                self.named.add(rank)
                lines += f"rank {rank} is also at a breakpoint, next\n"
        return lines


def _print(text: str) -> None:
    print(text, end="" if text.endswith("\n") else "\n", flush=True)
