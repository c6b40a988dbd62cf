"""Interrupting the code a pool worker runs, the way Ctrl-C interrupts a notebook cell.

User code runs on the worker's command thread, never its main thread (see ``worker/entry.py``
for the OpenMP reason), and Python delivers signals to the main thread only. So the kernel
writes the number of the command to interrupt into a pipe; a watcher thread reads it and raises
``KeyboardInterrupt`` in the command thread (``PyThreadState_SetAsyncExc``), which Python
delivers at the next bytecode. Code blocked inside a C call (a sleep, a collective waiting for
a peer) only sees it when the call returns; the kernel gives up waiting after a grace period and
restarts the workers instead.

The exception is only ever raised while that very command's user code runs: :meth:`Guard.run`
marks the span under a lock, and a late interrupt that still lands afterwards is absorbed by it.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["INTERRUPTED", "Guard"]

INTERRUPTED = "interrupted"


class Guard:
    """Runs user code on the current thread, interruptible from the kernel by command number.

    Example::

        guard = Guard(interrupts); guard.watch()
        status, value = guard.run(7, lambda: 6 * 7)
        # ('ok', 42)
    """

    def __init__(self, interrupts: Connection) -> None:
        self._interrupts = interrupts
        self._lock = threading.Lock()
        self._running: int | None = None
        self._thread_id = threading.get_ident()

    def watch(self) -> None:
        """Start the thread that reads interrupt requests (it ends with the kernel's pipe)."""
        threading.Thread(target=self._watch, name="notebook_kit-interrupts", daemon=True).start()

    def run(self, command: int, body: Callable[[], Any]) -> tuple[str, Any]:
        """``("ok", value)``, ``("error", exception)`` or ``(INTERRUPTED, None)``."""
        outcome: tuple[str, Any] | None = None
        while True:
            try:
                if outcome is None:
                    with self._lock:
                        self._running = command
                    outcome = _attempt(body)
                with self._lock:
                    self._running = None
                _let_pending_arrive()
                return outcome
            except KeyboardInterrupt:  # asked for as the code ended: what it did stands
                outcome = outcome or (INTERRUPTED, None)

    def _watch(self) -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                command = int.from_bytes(self._interrupts.recv_bytes(), "little")
                with self._lock:
                    if self._running == command:
                        _raise_in(self._thread_id, KeyboardInterrupt)


def _attempt(body: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", body()
    except KeyboardInterrupt:
        return INTERRUPTED, None
    except BaseException as error:
        return "error", error


def _let_pending_arrive() -> None:
    """A Python-level call: an asynchronous exception set earlier is raised here at the latest."""


def _raise_in(thread_id: int, exception: type[BaseException]) -> None:
    set_async_exception = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async_exception(ctypes.c_ulong(thread_id), ctypes.py_object(exception))
