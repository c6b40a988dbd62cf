"""A fresh caller process for the measurements that need one.

``python -m benchmarks._child first TOOL RUN_DIR``: time the first launch of a new process
(like a new kernel whose import cell already ran), report it as ``first-launch``.
``python -m benchmarks._child hang TOOL RUN_DIR``: launch workers that run until stopped;
the benchmark interrupts this process and records what it raised as ``caught``.
"""

from __future__ import annotations

import signal
import sys
import time

from benchmarks._harness import report
from benchmarks._tools import TOOLS
from benchmarks._workloads import Task


def main(mode: str, tool_name: str, run_dir: str) -> int:
    # A kernel raises KeyboardInterrupt on SIGINT. Started from a process that ignores it
    # (``nohup``, some CI runners) Python would keep ignoring it, and the interrupt
    # measurements would time the wrong thing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tool = TOOLS[tool_name]
    tool.load()  # the import cell: not part of the launch
    if mode == "first":
        started = time.perf_counter()
        tool.launch(Task("allreduce", run_dir))
        report(run_dir, "first-launch", time.perf_counter() - started)
        return 0
    try:
        tool.launch(Task("hang", run_dir))
    except BaseException as error:  # the interrupt's outcome is what is measured
        report(run_dir, "caught", type(error).__name__)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
