"""One run of each measurement for one tool, seen from the caller (the notebook kernel's side).

Each function returns an ``Outcome`` (numbers plus notes) or raises ``NotApplicable``; it
always stops and reaps every worker it started, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks._harness import (
    Memory,
    extra_per_worker,
    is_gone,
    kill_and_reap,
    launched_processes,
    memory_of,
    new_run_dir,
    read_report,
    report,
    seconds_until_gone,
    settle_and_count,
    wait_for_reports,
    watchdog,
    worker_pids,
)
from benchmarks._tools import NUM_PROCESSES, Tool
from benchmarks._workloads import FAILURE_MARKER, SmallCNN, Task, train_steps

ROOT = Path(__file__).resolve().parent.parent
# Reading a shard takes well under a second; much longer means the workers hang.
_SHARD_READ_TIMEOUT = 30.0


class NotApplicable(Exception):
    """The tool cannot do this measurement; the message says why."""


@dataclass(frozen=True)
class Options:
    """Sizes and limits of one benchmark run."""

    dataset_bytes: int = 1 << 30
    warmup: int = 5
    steps: int = 30
    batch: int = 32  # per process; the single-process reference uses twice this
    run_timeout: float = 120.0  # a run taking longer is stopped and reported as failed
    interrupt_limit: float = 10.0  # workers still alive this long after SIGINT: "not stopped"


@dataclass
class Outcome:
    values: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def _run_dir() -> Iterator[Path]:
    """A run folder; on the way out every worker that reported a pid is killed and reaped."""
    path = new_run_dir()
    try:
        yield path
    finally:
        kill_and_reap(worker_pids(path))
        shutil.rmtree(path, ignore_errors=True)


def _launch(tool: Tool, task: Task, options: Options) -> None:
    hung = f"hung: not done after {options.run_timeout:g} s, so its workers were killed"
    with watchdog(Path(task.run_dir), options.run_timeout) as fired:
        try:
            tool.launch(task)
        except Exception as error:
            if fired.is_set():  # the tool only reports the kill; say what really happened
                raise RuntimeError(hung) from error
            raise
    if fired.is_set():
        raise RuntimeError(hung)


# -- launch latency ------------------------------------------------------------------------


def launch(tool: Tool, options: Options) -> Outcome:
    """Call to return of a launch whose function does one all_reduce."""
    with _run_dir() as run_dir:
        started = time.perf_counter()
        _launch(tool, Task("allreduce", str(run_dir)), options)
        return Outcome({"launch_repeat": time.perf_counter() - started})


def first_launch(tool: Tool, options: Options) -> Outcome:
    """The first launch in a fresh Python process (a new kernel whose import cell ran)."""
    with _run_dir() as run_dir, _caller("first", tool, run_dir) as caller:
        caller.wait(timeout=options.run_timeout)
        seconds = read_report(run_dir, "first-launch")
        if seconds is None:
            raise RuntimeError("the first-launch process reported nothing (see the log)")
        return Outcome({"launch_first": seconds})


@contextlib.contextmanager
def _caller(mode: str, tool: Tool, run_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``benchmarks._child`` as a fresh caller, in its own session: a signal sent to it (or
    its group) can never reach the benchmark's own terminal process group. Killed on exit."""
    command = [sys.executable, "-m", "benchmarks._child", mode, tool.name, str(run_dir)]
    caller = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        yield caller
    finally:
        if caller.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(caller.pid, signal.SIGKILL)
        caller.wait()


# -- training ------------------------------------------------------------------------------


def train(tool: Tool, options: Options) -> Outcome:
    """Median step time of a small CNN under DDP, after warm-up."""
    with _run_dir() as run_dir:
        task = Task(
            "train", str(run_dir), warmup=options.warmup, steps=options.steps, batch=options.batch
        )
        _launch(tool, task, options)
        ranks = [read_report(run_dir, f"train-{rank}") for rank in range(NUM_PROCESSES)]
    if any(rank is None for rank in ranks):
        raise RuntimeError("a worker reported no step times")
    step = statistics.median(ranks[0]["step_times"])
    threads = sorted({rank["threads"] for rank in ranks})
    return Outcome(
        {"step_time": step, "samples_per_s": NUM_PROCESSES * options.batch / step},
        {"step_time": f"{'/'.join(map(str, threads))} torch thread(s) per worker"},
    )


def single_process(options: Options) -> Outcome:
    """The same training in the caller, 1 process using every core, no launcher, no DDP."""
    saved = torch.get_num_threads()
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        model = SmallCNN()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        batch = NUM_PROCESSES * options.batch
        times = train_steps(
            model, optimizer, lambda loss: loss.backward(), batch, options.warmup, options.steps
        )
    finally:
        torch.set_num_threads(saved)
    step = statistics.median(times)
    return Outcome(
        {"step_time": step, "samples_per_s": batch / step},
        {"step_time": f"{threads} torch threads, batch {batch}"},
    )


# -- memory --------------------------------------------------------------------------------


def memory(tool: Tool, options: Options) -> Outcome:
    """Extra PSS/USS per worker while 2 workers read their shards of the caller's dataset."""
    data = torch.ones(options.dataset_bytes // 4)  # ones, not empty: every page is real
    measured: dict[str, Outcome | str] = {}
    with _run_dir() as run_dir:
        before = memory_of(os.getpid())
        earlier = set(launched_processes())  # not the launch's (a tool's helper process)
        probe = threading.Thread(target=_measure_workers, args=(run_dir, before, earlier, measured))
        probe.start()
        try:
            _launch(tool, Task("memory", str(run_dir), data=data), options)
        except Exception:
            if "hung" not in measured:
                raise
        finally:
            report(run_dir, "release", True)
            probe.join()
    del data
    result = measured.get("result") or measured.get("hung") or "the workers never reported"
    if isinstance(result, str):
        raise RuntimeError(result)
    return result


def _measure_workers(
    run_dir: Path, before: Memory, earlier: set[int], measured: dict[str, Outcome | str]
) -> None:
    """From the caller, while both workers are alive and have read their shard."""
    names = [f"ready-{rank}" for rank in range(NUM_PROCESSES)]
    if not wait_for_reports(run_dir, names, timeout=_SHARD_READ_TIMEOUT):
        measured["hung"] = (
            f"hung: the workers had not read their shard after {_SHARD_READ_TIMEOUT:g} s "
            f"(killed); torch threads per worker: {read_report(run_dir, 'threads-0')}"
        )
        kill_and_reap(worker_pids(run_dir))
        return
    try:
        parent = memory_of(os.getpid())
        pids = worker_pids(run_dir)
        workers = [memory_of(pid) for pid in pids]
        between = set(launched_processes()) - earlier - set(pids)  # e.g. the workers' parent
        others = [memory_of(pid) for pid in between if not is_gone(pid)]
    finally:
        report(run_dir, "release", True)
    extra = extra_per_worker(before, parent, [*workers, *others], workers)
    measured["result"] = Outcome({"mem_pss": extra.pss, "mem_uss": extra.uss})


# -- failure -------------------------------------------------------------------------------


def failure(tool: Tool, options: Options) -> Outcome:
    """Rank 1 raises while rank 0 waits in a barrier: time to the caller's exception, whether
    it shows rank 1's error, and how many workers are still listed 1 s later."""
    with _run_dir() as run_dir:
        try:
            _launch(tool, Task("fail", str(run_dir)), options)
        except Exception as error:  # what the tool raised is the measurement
            caught = time.monotonic()
            text = "".join(traceback.format_exception(error))
            kind = type(error).__name__
        else:
            raise RuntimeError("the launch returned normally although rank 1 raised")
        raised = read_report(run_dir, "raised-at")
        left = settle_and_count(worker_pids(run_dir), grace=1.0)
    if raised is None:
        raise RuntimeError(f"rank 1 never reached its raise; the launch failed first: {kind}")
    return Outcome(
        {
            "fail_time": caught - raised,
            "fail_shows_error": float(FAILURE_MARKER in text),
            "fail_left": float(left),
        },
        {"fail_time": f"caller got {kind}"},
    )


# -- interrupt -----------------------------------------------------------------------------


def interrupt(tool: Tool, options: Options, *, whole_group: bool) -> Outcome:
    """SIGINT to a caller process blocked in the launch (or to its whole process group, as
    Jupyter may do): seconds until no worker is running."""
    metric = "interrupt_group" if whole_group else "interrupt_caller"
    with _run_dir() as run_dir, _caller("hang", tool, run_dir) as caller:
        return _interrupt(caller, run_dir, metric, whole_group, options)


def _interrupt(
    caller: subprocess.Popen[bytes],
    run_dir: Path,
    metric: str,
    whole_group: bool,
    options: Options,
) -> Outcome:
    names = [f"running-{rank}" for rank in range(NUM_PROCESSES)]
    if not wait_for_reports(run_dir, names, timeout=options.run_timeout):
        raise RuntimeError("the workers did not start")
    time.sleep(0.2)  # let the caller settle into its wait
    pids = worker_pids(run_dir)
    sent = time.monotonic()
    if whole_group:
        os.killpg(caller.pid, signal.SIGINT)
    else:
        os.kill(caller.pid, signal.SIGINT)
    seconds = seconds_until_gone(pids, sent, options.interrupt_limit)
    with contextlib.suppress(subprocess.TimeoutExpired):
        caller.wait(timeout=options.interrupt_limit)
    note = _caller_outcome(caller, read_report(run_dir, "caught"))
    if seconds is None:
        alive = sum(not is_gone(pid) for pid in pids)
        note += f"; {alive} worker(s) still running after {options.interrupt_limit:g} s"
        return Outcome({metric: float("inf")}, {metric: note})
    return Outcome({metric: seconds}, {metric: note})


def _caller_outcome(caller: subprocess.Popen[bytes], caught: str | None) -> str:
    if caught is not None:
        return f"caller raised {caught}"
    if caller.returncode is None:
        return "caller still blocked"
    if caller.returncode < 0:
        return f"caller killed by {signal.Signals(-caller.returncode).name}"
    return f"caller exited with code {caller.returncode}"
