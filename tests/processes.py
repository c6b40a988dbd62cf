"""Processes in tests: the ``notebook-kit launch`` command, free ports, environments, and a
census of every descendant, re-parented orphans included."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil

CLI = [sys.executable, "-m", "notebook_kit", "launch"]
_PR_SET_CHILD_SUBREAPER = 36


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def clean_environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without a saved default config or scheduler variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "COILED_", "PET_"))}
    env.pop("OMP_NUM_THREADS", None)
    return {**env, "NOTEBOOK_KIT_CONFIG": str(tmp_path / "none.json"), **extra}


def kernel_environment() -> dict[str, str]:
    """Environment for a Jupyter kernel started by a test.

    ipykernel stops forwarding fd-level output when PYTEST_CURRENT_TEST is set.
    """
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


@contextlib.contextmanager
def child_subreaper() -> Iterator[None]:
    """Make this process adopt its orphaned descendants (Linux) while the block runs.

    Without it a grandchild whose parent died is re-parented to init and no longer looks
    like ours; with it, ``descendants()`` still finds it.
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, 0)


def descendants() -> list[psutil.Process]:
    """Every process below this one, zombies included."""
    return psutil.Process().children(recursive=True)


def kill_and_reap(processes: Iterable[psutil.Process]) -> None:
    """SIGKILL ``processes`` and reap those that are (now) children of this process."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGKILL)
    for process in processes:
        with contextlib.suppress(ChildProcessError, psutil.Error):
            if process.ppid() == os.getpid():
                os.waitpid(process.pid, 0)


def marked_node_processes(mark: str, token: str) -> list[int]:
    """The node processes whose environment holds ``mark=token``: one test module's, also one
    its engine's worker no longer holds (an orphan), whatever else runs on the machine."""
    from notebook_kit.node.task import NODE_PROCESS_NAME

    found = []
    for process in psutil.process_iter(["pid", "name"]):
        if process.info["name"] != NODE_PROCESS_NAME:  # forked by a zygote, as its own forks
            continue
        with contextlib.suppress(psutil.Error):
            if process.environ().get(mark) == token:
                found.append(process.info["pid"])
    return found
