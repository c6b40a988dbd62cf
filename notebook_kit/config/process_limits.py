"""How many worker processes this machine can start, and which of its limits says so.

A launch asking for more workers than the machine allows fails late and badly: the kernel
runs out of file descriptors halfway through the fork ("Too many open files"), or the forks
fail once the process limit is reached, or thousands of workers share two cores. The count is
checked against these limits before anything is opened or forked, and the error names the
limit that binds, so the fix (a smaller count, or a raised ``ulimit``) is clear.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

from notebook_kit.config.environment import usable_cpu_count

__all__ = ["PER_CORE", "ProcessLimit", "check_process_count", "process_limits"]

# File descriptors the kernel holds per worker while it forks them: the read and write ends
# of its output, error and message pipes, and a pool's command and interrupt pipes.
_FDS_PER_WORKER = 10
_FDS_SPARE = 64  # what the kernel itself, the listener and the guardian's pipes keep using
# More workers than this per core only take turns on the cores, each one slower than alone.
PER_CORE = 32


@dataclass(frozen=True)
class ProcessLimit:
    """At most ``count`` workers, because of ``source`` (said as a person checks it)."""

    count: int
    source: str


def _open_file_limit() -> ProcessLimit | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: count nothing as open
        open_now = 0
    count = max(0, (soft - open_now - _FDS_SPARE) // _FDS_PER_WORKER)
    source = (
        f"the open-file limit (`ulimit -n` is {soft}, {open_now} open now, and each worker "
        f"needs {_FDS_PER_WORKER} while it starts)"
    )
    return ProcessLimit(count, source)


def _cgroup_pids_limit() -> ProcessLimit | None:
    """The cgroup's ``pids.max`` (containers, systemd slices), less the tasks already in it."""
    try:
        entry = Path("/proc/self/cgroup").read_text().splitlines()[0]
        folder = Path("/sys/fs/cgroup") / entry.split(":", 2)[2].lstrip("/")
        maximum = (folder / "pids.max").read_text().strip()
        current = int((folder / "pids.current").read_text())
    except (OSError, IndexError, ValueError):
        return None
    if not maximum.isdigit():  # "max": no limit
        return None
    count = max(0, int(maximum) - current - 1)  # the guardian is a process too
    return ProcessLimit(
        count, f"the container's process limit (pids.max {maximum}, {current} used)"
    )


def _user_process_limit() -> ProcessLimit | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        return None
    return ProcessLimit(max(0, soft - 1), f"the process limit (`ulimit -u` is {soft})")


def process_limits() -> list[ProcessLimit]:
    """Every limit on the worker count that applies here, smallest first."""
    cores = usable_cpu_count()
    limits = [ProcessLimit(PER_CORE * cores, f"{PER_CORE} workers per CPU core ({cores} here)")]
    for find in (_open_file_limit, _cgroup_pids_limit, _user_process_limit):
        limit = find()
        if limit is not None:
            limits.append(limit)
    return sorted(limits, key=lambda limit: limit.count)


def check_process_count(num_processes: int, keyword: str = "num_processes") -> None:
    """Refuse a worker count this machine cannot start, naming the limit that binds.

    Raises:
        ValueError: ``num_processes`` exceeds the smallest limit; the message says which.

    Example:
        >>> check_process_count(2)
    """
    limit = process_limits()[0]
    if num_processes <= limit.count:
        return
    fewer = min(limit.count, usable_cpu_count())
    advice = f"Use {keyword}={fewer} or fewer" if fewer >= 1 else "Raise that limit first"
    raise ValueError(
        f"{keyword}={num_processes} is more workers than this machine can run: "
        f"{limit.source} allows at most {limit.count}. {advice} (more workers than cores "
        "only take turns on them)."
    )
