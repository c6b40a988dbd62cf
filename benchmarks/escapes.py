"""Does any process started during a launch outlive it? Counted over many runs.

Run from the repository root::

    .venv/bin/python -m benchmarks.escapes --runs 30

Each run starts a fresh kernel process (``benchmarks._escape_kernel``) whose 2 workers each
start a ``sleep`` in their process group, one in a new session, an orphaned one, and 2
DataLoader workers (10 processes besides the workers). Variants: the launch finishes, a rank
fails, the kernel is SIGKILLed, its process group gets SIGTERM, its group gets SIGKILL. A
survivor is a recorded process still running when the launch has returned (finish, fail), or
``--grace`` seconds after the kernel was killed. Prints one line per variant.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks._harness import is_gone

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("finish", "fail", "kernel-sigkill", "group-sigterm", "group-sigkill")
_KILLS = {
    "kernel-sigkill": lambda pid: os.kill(pid, signal.SIGKILL),
    "group-sigterm": lambda pid: os.killpg(pid, signal.SIGTERM),
    "group-sigkill": lambda pid: os.killpg(pid, signal.SIGKILL),
}
_PROCESSES_PER_WORKER = 6  # itself, 3 sleeps, 2 DataLoader workers


@dataclass(frozen=True)
class RunResult:
    """One run: the processes recorded, those that outlived the launch, and how long the last
    one took to go after the kernel was killed (None for finish/fail, or if some survived)."""

    recorded: int
    survivors: list[int]
    seconds_to_clean: float | None


def run_variant(variant: str, grace: float = 3.0, start_timeout: float = 90.0) -> RunResult:
    """Run one launch of ``variant`` in a fresh kernel process and count what survives it."""
    known = _zombie_children()
    with tempfile.TemporaryDirectory(prefix="nk-escapes-") as run_dir:
        command = [sys.executable, "-m", "benchmarks._escape_kernel", variant, run_dir]
        kernel = subprocess.Popen(command, cwd=ROOT, start_new_session=True, env=_environment())
        recorded: list[int] = []
        try:
            _wait_for(
                lambda: (
                    all((Path(run_dir) / f"ready-{r}").exists() for r in (0, 1))
                    or kernel.poll() is not None
                ),
                start_timeout,
            )
            recorded = recorded_pids(run_dir)
            if variant in _KILLS:
                return _after_kill(variant, kernel, recorded, grace)
            kernel.wait(timeout=start_timeout)
            alive_file = Path(run_dir) / "alive-after-launch"
            if not alive_file.exists():
                raise RuntimeError(
                    f"the kernel of {variant!r} ended with {kernel.returncode} before its census"
                )
            return RunResult(len(recorded), json.loads(alive_file.read_text()), None)
        finally:
            _kill_all([kernel.pid, *recorded])
            with contextlib.suppress(subprocess.TimeoutExpired):
                kernel.wait(timeout=10)
            _reap_adopted(known)


def _after_kill(
    variant: str, kernel: subprocess.Popen[bytes], recorded: list[int], grace: float
) -> RunResult:
    # The kernel's own children (the launch's guardian) must end too.
    tracked = [*recorded, *_children_of(kernel.pid)]
    killed = time.monotonic()
    _KILLS[variant](kernel.pid)
    kernel.wait(timeout=10)
    while not all(is_gone(pid) for pid in tracked) and time.monotonic() - killed < grace:
        time.sleep(0.005)
    survivors = [pid for pid in tracked if not is_gone(pid)]
    seconds = None if survivors else time.monotonic() - killed
    return RunResult(len(recorded), survivors, seconds)


def _children_of(parent: int) -> list[int]:
    return [pid for pid, (_, ppid) in _processes().items() if ppid == parent]


def _processes() -> dict[int, tuple[bytes, int]]:
    """State and parent pid of every process."""
    found = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        found[int(name)] = (fields[0], int(fields[1]))
    return found


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("OMP_NUM_THREADS", None)
    return env


def _wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the workers did not report their processes in time")
        time.sleep(0.02)


def recorded_pids(run_dir: str) -> list[int]:
    """The pids the launch's processes wrote to ``pids-*`` files in ``run_dir``."""
    return [
        int(line)
        for path in sorted(Path(run_dir).glob("pids-*"))
        for line in path.read_text().split()
    ]


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _reap_adopted(known: set[int]) -> None:
    """Reap exited children this process adopted as a subreaper (a killed kernel's guardian,
    under a test's process census): they are gone, only their exit status was left."""
    for pid in _zombie_children() - known:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # a zombie whose other threads still exit is not yet reapable


def _zombie_children() -> set[int]:
    me = os.getpid()
    return {pid for pid, (state, ppid) in _processes().items() if state == b"Z" and ppid == me}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--grace", type=float, default=3.0, help="seconds after a kill")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    arguments = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for variant in arguments.variants.split(","):
        results = [run_variant(variant, arguments.grace) for _ in range(arguments.runs)]
        escaped = sum(1 for result in results if result.survivors)
        survivors = sum(len(result.survivors) for result in results)
        processes = sum(result.recorded for result in results)
        times = sorted(r.seconds_to_clean for r in results if r.seconds_to_clean is not None)
        clean = (
            f"; all gone after {times[len(times) // 2]:.2f} s median, {times[-1]:.2f} s max"
            if times
            else ""
        )
        print(
            f"{variant:15} {arguments.runs} runs: {survivors} survivors of {processes} processes "
            f"({escaped} runs with any){clean}",
            flush=True,
        )


if __name__ == "__main__":
    main()
