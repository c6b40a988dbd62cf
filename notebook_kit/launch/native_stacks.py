"""Each rank's native frames, read from outside by py-spy when it is installed.

A rank's own answer (:mod:`notebook_kit.worker.stacks`) holds Python frames only, and a rank
stuck in native code that holds the GIL cannot give even those. ``py-spy dump --native``
reads a process's memory from outside (ptrace: the kernel is the ranks' ancestor, which is
what the operating system asks by default), so it shows the C frames under ``time.sleep`` or
inside gloo, and it answers for a rank that cannot. It is an optional extra
(``pip install 'notebook_kit[debug]'``); without it the text says once that only Python frames
are shown.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from notebook_kit.worker.stacks import HELPER_THREADS

__all__ = ["NativeDumps", "native_note", "py_spy"]

_WORKER_ENTRY = "(notebook_kit/worker/"  # py-spy's path of a frame in the worker's own code
_WIDTH = 160
# A kernel's environment often forces colours (FORCE_COLOR, CLICOLOR_FORCE): py-spy then writes
# terminal escapes, which the cell would show as text.
_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")

MISSING = (
    "Python frames only: py-spy is not installed here "
    "(pip install 'notebook_kit[debug]' adds each rank's native frames)."
)


def py_spy() -> str | None:
    """The py-spy program: on the PATH, or beside this Python (a virtual environment's)."""
    found = shutil.which("py-spy")
    if found is not None:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else None


def native_note(found: bool) -> str | None:
    """What a reader of the stacks should know once: that native frames are missing."""
    return None if found else MISSING


class NativeDumps:
    """One ``py-spy dump --native`` per rank, run at once, read by a deadline.

    Example::

        dumps = NativeDumps.start({0: 4711, 1: 4712})   # None without py-spy
        texts = dumps.collect(time.monotonic() + 2.0)  # {rank: text}
    """

    def __init__(self, program: str, pids: dict[int, int]) -> None:
        self._running = {
            rank: subprocess.Popen(
                [program, "dump", "--native", "--pid", str(pid)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                env={**os.environ, "NO_COLOR": "1", "CLICOLOR_FORCE": "0", "FORCE_COLOR": "0"},
            )
            for rank, pid in pids.items()
        }

    @classmethod
    def start(cls, pids: dict[int, int]) -> NativeDumps | None:
        """Start reading ``{rank: pid}``; None when py-spy is not installed."""
        program = py_spy()
        return None if program is None else cls(program, pids)

    def collect(self, deadline: float) -> dict[int, str]:
        """Each rank's native frames, or why there are none; nothing is left running."""
        texts = {}
        for rank, process in self._running.items():
            try:
                out, _ = process.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                texts[rank] = "py-spy gave no answer in time"
                continue
            if process.returncode != 0:
                first = out.strip().splitlines()[:1] or [f"exit code {process.returncode}"]
                texts[rank] = f"py-spy could not read it: {first[0]}"
            else:
                texts[rank] = _threads_only(out)
        return texts


def _threads_only(dump: str) -> str:
    """py-spy's dump cut to what the user's threads do.

    Its heading (command line, Python version) goes, and so do this package's helper threads
    and, in each thread, the frames below the worker's entry (how the process was started);
    a C++ frame's name, which can run to thousands of characters, is cut short.
    """
    kept: list[str] = []
    skipping = False
    for line in _ESCAPES.sub("", dump).splitlines():
        if line.startswith("Thread "):
            skipping = any(f'"{helper}"' in line for helper in HELPER_THREADS)
            if not skipping:
                kept.append(line)
        elif not skipping and line.strip() and kept:
            if _WORKER_ENTRY in line:
                skipping = True  # the rest is how the worker was started
            else:
                kept.append(line if len(line) <= _WIDTH else line[: _WIDTH - 1] + "…")
    return "\n".join(kept)
