"""One-time imports that every forked worker would otherwise pay at every launch, and forks
that never copy an import half-way.

``DistributedDataParallel`` imports ``torch._dynamo`` the first time it is built and called
(one to several seconds); a forked worker starts from the kernel's memory, so whatever the
kernel has imported, every worker already has. A background thread imports these modules once,
starting when the launcher is first imported (the notebook's import cell), so the time is
usually spent before the launch cell runs.

A fork taken while any thread of the kernel is inside an import copies a partly initialised
module (and its held import lock) into the child, where nothing finishes it: the child's next
``import`` of it fails with "partially initialized module". So every fork of this process first
waits until no other thread is inside an import (an ``os.register_at_fork`` hook): the
launcher's workers, the fork probe, and the user's own forks. That covers imports by any
thread, ours or a library's, by reading CPython's per-module import locks.

An import that Ctrl-C cuts short can leave a package half-initialised for good: matplotlib
cut mid-import fails every later import with ``KeyError: 'PolyCollection:kwdoc'``. Python
raises KeyboardInterrupt only on the main thread, so the live view's first imports run on a
thread of their own (:func:`import_whole`): a press ends the wait for them, never the imports.

The launcher waits for the warm-up before it forks, where Ctrl-C can stop the launch. Done
imports are recorded by an event set when the thread ends, never by ``Thread.join``: a
KeyboardInterrupt inside ``join`` makes CPython 3.11 take a thread that is still importing for
finished, and every later fork would then copy the half-done import.

Only imports happen here: nothing touches CUDA, starts a thread pool or creates a process group.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable

__all__ = [
    "WARM_MODULES",
    "import_whole",
    "imports_under_way",
    "start_warmup",
    "wait_for_imports",
    "wait_for_warmup",
]

# What a worker's first training step imports lazily, found by listing the modules a forked
# worker adds to ``sys.modules`` during a DDP step of a small CNN.
WARM_MODULES = ("torch._dynamo",)

# A fork waits at most this long for another thread's import; past it, it forks with a warning
# (a thread stuck in an import would otherwise hang every fork of the kernel).
IMPORT_WAIT_LIMIT_S = 120.0
_POLL_S = 0.005

_thread: threading.Thread | None = None
_done = threading.Event()
_lock = threading.Lock()


def _import_all() -> None:
    try:
        for name in WARM_MODULES:
            with contextlib.suppress(Exception):  # a module that cannot load is paid in the worker
                importlib.import_module(name)
    finally:
        _done.set()


def start_warmup() -> None:
    """Start the background imports (once per process).

    Example:
        >>> start_warmup(); wait_for_warmup()
    """
    global _thread
    with _lock:
        if _thread is not None:
            return
        _thread = threading.Thread(target=_import_all, name="notebook_kit-warmup", daemon=True)
        os.register_at_fork(before=_before_fork)
        _thread.start()


def import_whole(load: Callable[[], object]) -> None:
    """Run ``load`` (imports) on a thread of its own and wait for it; what it raised, raised.

    Ctrl-C ends the wait with KeyboardInterrupt while the imports go on to their end, so
    nothing is left half-imported; a later call finds them done, or waits for them (Python's
    import lock), and a fork meanwhile waits for them too.

    Example:
        >>> import_whole(lambda: importlib.import_module("json"))
    """
    done = threading.Event()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            load()
        except BaseException as error:  # handed to the waiting thread
            raised.append(error)
        finally:
            done.set()

    threading.Thread(target=run, name="notebook_kit-view-imports", daemon=True).start()
    while not done.wait(0.05):  # never Thread.join: see the module's docstring
        pass
    if raised:
        raise raised[0]


def imports_under_way() -> list[str]:
    """The modules another thread of this process is importing right now.

    Threads blocked waiting for a module this thread holds are left out: they cannot go on
    until this thread does, so waiting for them would never end.
    """
    bootstrap = sys.modules.get("importlib._bootstrap")
    locks = getattr(bootstrap, "_module_locks", None)
    if not locks:
        return []
    me = threading.get_ident()
    blocked = _threads_blocked_on(bootstrap, me)
    names = []
    for name, reference in list(locks.items()):
        lock = reference() if callable(reference) else None
        owner = getattr(lock, "owner", None)
        if owner is not None and owner != me and owner not in blocked:
            names.append(name)
    return names


def _threads_blocked_on(bootstrap: object, me: int) -> set[int]:
    """Threads waiting for an import lock that this thread owns."""
    blocking_on = getattr(bootstrap, "_blocking_on", None) or {}
    blocked = set()
    for tid, waited in list(blocking_on.items()):
        # 3.11: the lock itself; 3.12 and later: a list of the locks waited on.
        for lock in waited if isinstance(waited, list) else [waited]:
            if getattr(lock, "owner", None) == me:
                blocked.add(tid)
    return blocked


def wait_for_warmup() -> None:
    """Block until the background imports are done and no other thread is inside an import.

    Ctrl-C raises here, and leaves nothing half-recorded: the next call waits again.
    """
    thread = _thread
    if thread is not None and thread is not threading.current_thread():
        while not _done.wait(0.05):
            pass
    wait_for_imports()


def wait_for_imports(limit: float = IMPORT_WAIT_LIMIT_S) -> bool:
    """Block until no other thread is inside an import (at most ``limit`` s); False if one is."""
    deadline = time.monotonic() + limit
    while imports_under_way():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _before_fork() -> None:
    """Every fork waits for imports under way in other threads, whatever Ctrl-C does meanwhile.

    CPython discards an exception raised in an at-fork hook and forks anyway, so an interrupt
    cannot stop the wait here: it would only let the fork copy a half-done import. The press
    is kept and delivered after the fork where the launcher holds interrupts during its forks
    (``launch/interrupts.py``); a bare ``os.fork()`` of the user's own loses it, as it would in
    any other at-fork hook.
    """
    deadline = time.monotonic() + IMPORT_WAIT_LIMIT_S
    while True:
        try:
            if _thread is not None and _thread is not threading.current_thread():
                _done.wait(max(deadline - time.monotonic(), 0.0))
            if not wait_for_imports(max(deadline - time.monotonic(), 0.0)):
                warnings.warn(
                    "forking while another thread is still importing "
                    f"{', '.join(imports_under_way())} after {IMPORT_WAIT_LIMIT_S:g} s: the child "
                    "may see those modules half-initialised",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return
        except KeyboardInterrupt:
            continue
