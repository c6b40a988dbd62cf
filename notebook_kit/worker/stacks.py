"""Answering "where are you?" from the kernel without stopping: a worker's live stacks.

A rank blocked in a collective holds no lock the kernel could wait on and prints nothing, so
the kernel cannot see where it is. When no rank has made progress for a while, the kernel
sends each worker :data:`STACKS_SIGNAL`. The signal is blocked in every thread of the worker
and taken by one small thread waiting in ``sigwait`` (a Python signal handler would run on the
main thread only, which is the one stuck in C). That thread reads every thread's current
Python stack and sends it home as a message; the run itself goes on untouched, and while no
signal comes the thread costs nothing.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import traceback
from pathlib import PurePath
from typing import Any

from notebook_kit.runtime.messages import Send, Stacks
from notebook_kit.runtime.waiting import collective_of

__all__ = ["HELPER_THREADS", "STACKS_SIGNAL", "answer_stack_requests", "current_stacks"]

# A real-time signal: nothing a user or a library installs by default (SIGUSR1 is SLURM's).
STACKS_SIGNAL: int = signal.SIGRTMIN + 6
HELPER_THREADS = (
    "notebook_kit-metrics",
    "notebook_kit-interrupts",
    "notebook_kit-stacks",
    "notebook_kit-profile",
)
_PACKAGE = PurePath(__file__).parents[1]
_SHOWN_FRAMES = 8


def answer_stack_requests(send: Send) -> None:
    """Block :data:`STACKS_SIGNAL` here (threads started later inherit it) and answer it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {STACKS_SIGNAL})
    thread = threading.Thread(target=_answer, args=(send,), name=HELPER_THREADS[2], daemon=True)
    thread.start()


def _answer(send: Send) -> None:
    while True:
        signal.sigwait({STACKS_SIGNAL})
        with contextlib.suppress(Exception):  # the kernel went away: nothing to tell
            send(Stacks(tuple(current_stacks())))


def current_stacks(only: int | None = None) -> list[dict[str, Any]]:
    """Every thread that runs user code (``only``: that thread): its name, its stack as text,
    its collective."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for ident, frame in sys._current_frames().items():
        name = names.get(ident, f"thread {ident}")
        if name in HELPER_THREADS or only not in (None, ident):
            continue
        summary = traceback.extract_stack(frame)
        collective = collective_of([(f.filename, f.name) for f in summary])
        shown = [f for f in summary if not _is_internal(f.filename)]
        while shown and shown[0].filename == threading.__file__:  # how the thread began
            shown.pop(0)
        shown = shown[-_SHOWN_FRAMES:]
        threads.append(
            {
                "name": "main thread" if ident == main else name,
                "main": ident == main,
                "collective": collective,
                "stack": "".join(traceback.format_list(shown)),
            }
        )
    return sorted(threads, key=lambda thread: not thread["main"])


def _is_internal(filename: str) -> bool:
    """Frames the user did not write: this package's and torch.distributed's (named instead)."""
    path = PurePath(filename)
    if path.is_relative_to(_PACKAGE):
        return True
    return "torch" in path.parts and "distributed" in path.parts
