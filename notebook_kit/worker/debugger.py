"""A worker's ``breakpoint()``: pdb on this rank, typed at and read in the kernel's cell.

A forked worker's standard input is not the notebook's: a plain pdb there would read end of
file and go on. Here ``sys.breakpointhook`` and ``pdb.set_trace`` start a pdb whose input and
output are a channel to the kernel. At each prompt the rank sends what pdb printed and its
prompt (``(Pdb rank 1) ``) as a :class:`~notebook_kit.runtime.messages.DebuggerPrompt`; the
kernel's supervising loop asks the user with ``input()`` (in a notebook, the same box as an
``input()`` in a cell) and writes the line back on this rank's answer pipe, made at the fork.

``c`` goes on; ``q`` ends the function with :class:`DebuggerQuit`, so the run ends as this
rank's failure and the kernel stops the others (none is left waiting in a collective). When
the frontend allows no input (``notebook-kit execute``, nbclient), the kernel answers with no
line and the rank prints one line saying which breakpoint it skipped, then goes on.
``NOTEBOOK_KIT_BREAK_RANKS=1`` (or ``0,2``) limits the ranks that stop; the others skip.

:func:`post_mortem` opens the same pdb on an exception's traceback, in the frame that raised
it (``pool.debug()``, ``post_mortem=True``); there ``q`` and ``c`` both just leave it.
"""

from __future__ import annotations

import bdb
import contextlib
import os
import pdb
import sys
import threading
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from notebook_kit.errors import is_consequence
from notebook_kit.runtime.messages import (
    DebuggerLeft,
    DebuggerPrompt,
    Send,
    decode_line,
)
from notebook_kit.worker.rendezvous import mark_debugging

__all__ = [
    "BREAK_RANKS",
    "DebuggerQuit",
    "break_ranks",
    "install_debugger",
    "post_mortem",
    "worth_a_post_mortem",
]

BREAK_RANKS = "NOTEBOOK_KIT_BREAK_RANKS"


class DebuggerQuit(bdb.BdbQuit):
    """The user quit pdb (``q``) on a rank: the run ends as that rank's failure."""


def break_ranks(value: str | None = None) -> frozenset[int] | None:
    """The ranks that stop at ``breakpoint()``, from ``NOTEBOOK_KIT_BREAK_RANKS``; None: all.

    Example:
        >>> sorted(break_ranks("0, 2"))
        [0, 2]
    """
    raw = os.environ.get(BREAK_RANKS, "") if value is None else value
    if not raw.strip():
        return None
    try:
        ranks = frozenset(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        ranks = frozenset({-1})
    if not ranks or min(ranks) < 0:
        raise ValueError(
            f"{BREAK_RANKS}={raw!r} is not a list of ranks. Set it to rank numbers separated "
            f"by commas ('1' or '0,2'), or unset it so every rank stops at breakpoint()."
        )
    return ranks


def install_debugger(rank: int, send: Send, answers: Connection) -> None:
    """In a forked worker: ``breakpoint()`` and ``pdb.set_trace()`` open pdb in the cell."""
    session = _Session(rank, send, answers)
    sys.breakpointhook = session.hook
    pdb.set_trace = session.set_trace  # type: ignore[assignment]


def worth_a_post_mortem(error: BaseException) -> bool:
    """An error of the rank's own code: not a quit pdb, an interrupt, an exit, nor an error
    that only says a peer went away (its cause is on that peer, which has its own)."""
    if not isinstance(error, Exception) or isinstance(error, bdb.BdbQuit):
        return False
    return not is_consequence(type(error).__qualname__, str(error))


def post_mortem(error: BaseException) -> bool:
    """pdb in the frame that raised ``error``, at the kernel's prompt; False: no prompt here.

    Ends when the user types ``q`` or ``c`` (neither raises: the failure goes on as it would
    have), when nobody can type (one line says the post-mortem was skipped) or at Ctrl-C.
    """
    session = getattr(sys.breakpointhook, "__self__", None)
    if not isinstance(session, _Session) or error.__traceback__ is None:
        return False  # no answer pipe: a process the kernel cannot prompt for
    last = error.__traceback__
    while last.tb_next is not None:
        last = last.tb_next
    location = f"{last.tb_frame.f_code.co_filename}:{last.tb_lineno}"
    channel = _Channel(session, location, "post-mortem")
    channel.write(f"Post-mortem of rank {session.rank}: {type(error).__name__}: {error}\n")
    debugger = _RankPdb(channel)
    debugger.reset()
    with contextlib.suppress(DebuggerQuit):
        debugger.interaction(None, error.__traceback__)
    debugger.left()  # a step command ends a post-mortem too: there is no code to step into
    return True


class _Session:
    """This rank's way to the kernel's prompt; one pdb at a time, whichever thread stops."""

    def __init__(self, rank: int, send: Send, answers: Connection) -> None:
        self.rank = rank
        self.send = send
        self.answers = answers
        self.lock = threading.Lock()
        self.skipped: set[str] = set()  # each skipped location is said once

    def hook(self, *args: Any, **kwargs: Any) -> None:
        """``sys.breakpointhook``: stop in the frame that called ``breakpoint()``."""
        self.stop(sys._getframe(1))

    def set_trace(self, *, header: str | None = None) -> None:
        """``pdb.set_trace``: the same, with pdb's optional header shown first."""
        self.stop(sys._getframe(1), header)

    def stop(self, frame: FrameType, header: str | None = None) -> None:
        if os.environ.get("PYTHONBREAKPOINT") == "0":  # Python's own switch: no debugging
            return
        location = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        chosen = break_ranks()
        if chosen is not None and self.rank not in chosen:
            self.say_skipped(location, f"{BREAK_RANKS}={os.environ[BREAK_RANKS]} stops others")
            return
        channel = _Channel(self, location)
        if header is not None:
            channel.write(header + "\n")
        _RankPdb(channel).set_trace(frame)

    def say_skipped(self, location: str, why: str, what: str = "breakpoint()") -> None:
        if location not in self.skipped:  # in the cell, with the prompts, not in the view
            self.skipped.add(location)
            line = f"{what} on rank {self.rank} at {location} skipped: {why}\n"
            self.send(DebuggerLeft(self.rank, line))


class _Channel:
    """pdb's stdin and stdout on one rank: output gathered, each line asked of the kernel."""

    def __init__(self, session: _Session, location: str, what: str = "breakpoint()") -> None:
        self.session = session
        self.location = location
        self.what = what  # named in the line of a skipped stop
        self.prompt = f"(Pdb rank {session.rank}) "
        self.output: list[str] = []
        self.skipped = ""  # why nobody can type at the prompt, when nobody can
        self.marked = False  # said on the group's store that this rank is in pdb
        self.interrupted = False  # the kernel was interrupted at the prompt

    def write(self, text: str) -> int:
        self.output.append(text)
        return len(text)

    def flush(self) -> None:
        """Output goes with the next prompt, or when pdb is left."""

    def take_output(self) -> str:
        text, self.output = "".join(self.output), []
        return text

    def readline(self) -> str:
        """Send pdb's output and prompt; the kernel's line back ('' when it is gone: EOF)."""
        output = self.take_output().removesuffix(self.prompt)
        session = self.session
        self.mark(True)
        with session.lock:
            session.send(DebuggerPrompt(session.rank, output, self.prompt, self.location))
            try:
                line = decode_line(session.answers.recv_bytes())
            except (EOFError, OSError):
                return ""
        if line.interrupted:
            self.interrupted = True
            return "quit\n"
        if line.text is None:
            self.skipped = line.why or "nobody can type at this prompt"
            self.mark(False)
            return "continue\n"
        return line.text + "\n"

    def mark(self, debugging: bool) -> None:
        """While this rank is in pdb, the rank hosting the store waits for it at the end."""
        if self.marked != debugging:
            self.marked = debugging
            mark_debugging(self.session.rank, debugging)


class _RankPdb(pdb.Pdb):
    """pdb on the channel, prompting with the rank; says when it is left, and how."""

    def __init__(self, channel: _Channel) -> None:
        super().__init__(stdin=channel, stdout=channel, nosigint=True, readrc=False)
        self.prompt = channel.prompt
        self.channel = channel
        self.continuing = False

    def set_continue(self) -> None:
        self.continuing = True
        super().set_continue()

    def interaction(self, frame: FrameType | None, traceback: Any) -> None:
        self.continuing = False  # a stop at a breakpoint set earlier: a new visit
        super().interaction(frame, traceback)
        channel = self.channel
        if channel.skipped:
            channel.take_output()
            channel.session.say_skipped(channel.location, channel.skipped, channel.what)
            return
        if not (self.continuing or self.quitting):
            return  # a step: the next prompt comes from the next line
        self.left()
        if channel.interrupted:
            raise KeyboardInterrupt
        if self.quitting:
            raise DebuggerQuit(f"quit the debugger (q) at {channel.location}")

    def left(self) -> None:
        """Say in the cell that this rank left pdb (once), with what pdb printed last."""
        channel = self.channel
        if channel.marked or channel.output:
            channel.mark(False)
            channel.session.send(DebuggerLeft(channel.session.rank, channel.take_output()))
