"""One-time imports that every forked worker would otherwise pay at every launch.

``DistributedDataParallel`` imports ``torch._dynamo`` the first time it is built and called
(one to several seconds); a forked worker starts from the kernel's memory, so whatever the
kernel has imported, every worker already has. A background thread imports these modules once,
starting when the launcher is first imported (the notebook's import cell), so the time is
usually spent before the launch cell runs.

A fork taken while that thread holds an import lock would copy the held lock into the child,
where nothing releases it, so every fork of this process waits for the thread first (an
``os.register_at_fork`` hook): the launcher's workers, the fork probe, and the user's own.

Only imports happen here: nothing touches CUDA, starts a thread pool or creates a process group.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading

__all__ = ["WARM_MODULES", "start_warmup", "wait_for_warmup"]

# What a worker's first training step imports lazily, found by listing the modules a forked
# worker adds to ``sys.modules`` during a DDP step of a small CNN.
WARM_MODULES = ("torch._dynamo",)

_thread: threading.Thread | None = None
_lock = threading.Lock()


def _import_all() -> None:
    for name in WARM_MODULES:
        with contextlib.suppress(Exception):  # a module that cannot load is paid in the worker
            importlib.import_module(name)


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
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(before=wait_for_warmup)
        _thread.start()


def wait_for_warmup() -> None:
    """Block until the background imports are done (at once if they are, or never started)."""
    thread = _thread
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join()
