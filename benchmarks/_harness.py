"""Timing, process and memory helpers shared by ``launch.py`` and ``compare.py``.

Workers talk to the benchmark through small JSON files in a per-run folder rather than
through return values, because the tools differ there (Accelerate's ``notebook_launcher``
returns nothing) and a file works the same for fork, spawn and a separate caller process.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psutil

MIB = 1 << 20
_PR_SET_CHILD_SUBREAPER = 36


# -- summaries -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """Median and range of repeated measurements."""

    median: float
    low: float
    high: float
    count: int


def summarize(values: Sequence[float]) -> Summary:
    """Median, min and max of ``values`` (at least one)."""
    return Summary(statistics.median(values), min(values), max(values), len(values))


def rotated(items: Sequence[Any], shift: int) -> list[Any]:
    """``items`` starting at position ``shift``: each repetition starts with another tool,
    so drift of a shared, busy machine does not always hit the same one first."""
    if not items:
        return []
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago (what a hand-written launcher does)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- the run folder: workers report, the caller reads --------------------------------------


def new_run_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="nk-bench-"))


def report(run_dir: str | os.PathLike[str], name: str, value: Any) -> None:
    """Write ``value`` as JSON under ``name``, atomically (readers never see half a file)."""
    target = Path(run_dir) / name
    partial = target.with_suffix(f".{os.getpid()}.part")
    partial.write_text(json.dumps(value))
    partial.replace(target)


def read_report(run_dir: str | os.PathLike[str], name: str) -> Any:
    """The value written under ``name``, or None if there is none yet."""
    with contextlib.suppress(FileNotFoundError):
        return json.loads((Path(run_dir) / name).read_text())
    return None


def wait_for_reports(run_dir: Path, names: Iterable[str], timeout: float) -> bool:
    """Wait until every report in ``names`` exists; False on timeout."""
    deadline = time.monotonic() + timeout
    names = list(names)
    while not all((run_dir / name).exists() for name in names):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def worker_pids(run_dir: Path) -> list[int]:
    """Pids the workers of a run reported (``pid-<rank>``)."""
    return [int(json.loads(path.read_text())) for path in sorted(run_dir.glob("pid-*[0-9]"))]


# -- processes -----------------------------------------------------------------------------


def become_subreaper() -> None:
    """Adopt orphaned descendants (Linux), so workers a tool abandons can still be reaped."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)


def is_gone(pid: int) -> bool:
    """True once ``pid`` has exited: no longer there, or a zombie (it holds no resources)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def still_listed(pids: Iterable[int]) -> list[int]:
    """Pids still in the process table, zombies included (nobody has reaped them)."""
    return [pid for pid in pids if psutil.pid_exists(pid)]


def seconds_until_gone(pids: Sequence[int], since: float, limit: float) -> float | None:
    """Seconds from ``since`` (monotonic) until every pid has exited; None past ``limit``."""
    while not all(is_gone(pid) for pid in pids):
        if time.monotonic() - since > limit:
            return None
        time.sleep(0.002)
    return time.monotonic() - since


def settle_and_count(pids: Sequence[int], grace: float) -> int:
    """How many of ``pids`` are still listed after waiting up to ``grace`` seconds for them."""
    deadline = time.monotonic() + grace
    while still_listed(pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(still_listed(pids))


def kill_and_reap(pids: Iterable[int]) -> None:
    """SIGKILL whatever is left of ``pids`` and reap every exited child of this process."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    reap_children()


def reap_children() -> None:
    """Collect exited children (between runs no tool is waiting on them any more)."""
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() == psutil.STATUS_ZOMBIE:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(child.pid, os.WNOHANG)


@contextlib.contextmanager
def watchdog(run_dir: Path, seconds: float) -> Iterator[threading.Event]:
    """Kill a run's workers if it takes longer than ``seconds``, so a hang cannot stop the
    benchmark; the yielded event is set if that happened."""
    fired = threading.Event()

    def fire() -> None:
        fired.set()
        kill_and_reap(worker_pids(run_dir))

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield fired
    finally:
        timer.cancel()


# -- memory --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """Proportional (PSS) and unique (USS) set size of one process, in bytes."""

    pss: int
    uss: int


def memory_of(pid: int) -> Memory:
    info = psutil.Process(pid).memory_full_info()
    return Memory(pss=int(info.pss), uss=int(info.uss))


def extra_per_worker(
    before: Memory, parent: Memory, launched: Sequence[Memory], workers: Sequence[Memory]
) -> Memory:
    """Memory the launch added, per worker.

    PSS splits every shared page between the processes that map it, so the caller's PSS
    plus the PSS of every process the launch added (workers, and any process between them and
    the caller), minus the caller's PSS before the launch, is the physical memory the launch
    really added, whether pages are shared copy-on-write (fork), moved to shared memory
    (torch tensors sent to spawned workers) or copied. USS is each worker's private memory:
    what would be freed if it exited.
    """
    added = parent.pss + sum(memory.pss for memory in launched) - before.pss
    uss = sum(memory.uss for memory in workers) / len(workers)
    return Memory(pss=round(added / len(workers)), uss=round(uss))


def launched_processes() -> list[int]:
    """Every live descendant of this process (the launch's workers and their parents)."""
    return [child.pid for child in psutil.Process().children(recursive=True)]


def run_cell(client: Any, code: str, timeout: float = 600) -> list[dict[str, Any]]:
    """Every IOPub message of one cell run through a jupyter_client, stamped with its arrival
    (wall clock, ``message["arrived"]``); the cell's error is raised as a RuntimeError."""
    msg_id = client.execute(code)
    messages, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = client.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
        message["arrived"] = time.time()
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(message)
        if message["msg_type"] == "error":
            raise RuntimeError("\n".join(message["content"]["traceback"]))
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return messages
    raise TimeoutError(code)


# -- output --------------------------------------------------------------------------------


@contextlib.contextmanager
def output_to(log_path: Path) -> Iterator[TextIO]:
    """Send fd 1 and 2 (the caller's and inherited by every worker) to ``log_path``.

    Tools print banners and warnings from their workers; this keeps them in a log and the
    benchmark's own report, written to the yielded stream, readable.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    console = os.fdopen(os.dup(1), "w", buffering=1)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield console
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        console.close()
