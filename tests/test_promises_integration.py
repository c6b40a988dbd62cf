"""Promises of docs/guarantees.md, checked with real forked workers in a way that fails when broken.

Output (warnings and C-level writes), SIGTERM then SIGKILL, the child-process sweep, the port
held from binding to forking, the seed, and the Accelerator's no_sync, autocast and
clip_grad_norm_ on two processes.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import torch.distributed as dist
from torch import nn

from notebook_kit import Accelerator, WorkerError, notebook_launcher
from notebook_kit.live.headless import HeadlessObserver
from notebook_kit.worker import guardian

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _read_pid(path: Path, deadline: float) -> int:
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path.name} never written"
        time.sleep(0.01)
    return int(path.read_text())


# -- output ---------------------------------------------------------------------------------


def _write_in_every_way() -> None:
    rank = dist.get_rank()
    libc = ctypes.CDLL(None)
    dist.barrier()  # both ranks write at the same time
    for index in range(100):
        os.write(1, f"fd {index} ".encode())  # one line in two writes: must stay whole
        os.write(1, f"of rank {rank}\n".encode())
        libc.printf(b"printf %d of rank %d\n", index, rank)
    libc.fflush(None)  # C stdio buffers its own copy: flushed as any C program would
    for index in range(3):  # the kernel surely reads the first half before the second exists
        os.write(1, f"slow {index} ".encode())
        time.sleep(0.1)
        os.write(1, f"of rank {rank}\n".encode())


def test_warnings_and_c_level_writes_reach_the_cell_as_whole_lines_per_rank(capsys):
    notebook_launcher(_write_in_every_way, num_processes=2)
    captured = capsys.readouterr()
    for rank in (0, 1):
        prefix = f"[rank {rank}] "
        mine = [line for line in captured.out.splitlines() if line.startswith(prefix)]
        fd_lines = [line for line in mine if line.startswith(f"{prefix}fd ")]
        printf_lines = [line for line in mine if line.startswith(f"{prefix}printf ")]
        assert fd_lines == [f"{prefix}fd {i} of rank {rank}" for i in range(100)]
        assert printf_lines == [f"{prefix}printf {i} of rank {rank}" for i in range(100)]
        slow_lines = [line for line in mine if line.startswith(f"{prefix}slow ")]
        assert slow_lines == [f"{prefix}slow {i} of rank {rank}" for i in range(3)]
    whole = re.compile(r"\[rank (\d)\] (fd|printf|slow) \d+ of rank \1")
    assert all(whole.fullmatch(line) for line in captured.out.splitlines() if "of rank" in line)


WARNING_SCRIPT = """
import warnings
import torch.distributed as dist
from notebook_kit import notebook_launcher

def warn():
    warnings.warn(f"careful on rank {dist.get_rank()}", UserWarning)

notebook_launcher(warn, num_processes=2)
"""


def test_warnings_reach_the_output_as_whole_lines_per_rank(tmp_path):
    # In a fresh interpreter: pytest records warnings itself, and forked workers inherit that.
    done = subprocess.run(
        [sys.executable, "-c", WARNING_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for rank in (0, 1):
        assert f"[rank {rank}] " in done.stderr
        lines = [line for line in done.stderr.splitlines() if f"careful on rank {rank}" in line]
        assert len(lines) == 1 and lines[0].startswith(f"[rank {rank}] "), done.stderr
        assert "UserWarning: careful on rank" in lines[0]


# -- stopping workers -----------------------------------------------------------------------


def _ignore_sigterm_then_wait(pid_file: str) -> None:
    if dist.get_rank() == 1:
        # What a stubborn library does; libc directly, as the function is off the main thread.
        libc = ctypes.CDLL(None)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(int(signal.SIGTERM), ctypes.c_void_p(1))  # SIG_IGN
        Path(pid_file).write_text(str(os.getpid()))
        dist.barrier()
        time.sleep(60)
    dist.barrier()  # rank 1 ignores SIGTERM from here on
    raise RuntimeError("rank 0 gives up")


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace(tmp_path):
    pid_file = tmp_path / "stubborn.pid"
    watchdog_fired = threading.Event()

    def watchdog() -> None:  # turns a hang (no SIGKILL) into a failure, not a stuck test
        pid = _read_pid(pid_file, time.monotonic() + 60)
        time.sleep(10)
        if _running(pid):
            watchdog_fired.set()
            os.kill(pid, signal.SIGKILL)

    guard = threading.Thread(target=watchdog, daemon=True)
    guard.start()
    with pytest.raises(WorkerError, match="rank 0 gives up") as caught:
        notebook_launcher(_ignore_sigterm_then_wait, args=(str(pid_file),), num_processes=2)
    took = time.monotonic() - caught.value.failures[0].time  # from rank 0's raise
    assert not watchdog_fired.is_set(), "the worker ignoring SIGTERM was never killed"
    assert caught.value.rank == 0
    assert not _running(int(pid_file.read_text()))
    # docs/guarantees.md: a failure ends the launch within a fraction of a second, SIGTERM's grace
    # (0.5 s) included.
    assert took < 1.0, f"took {took:.2f} s"


def _grandchild_then_fail(pid_file: str) -> None:
    if dist.get_rank() == 1:
        sleeper = subprocess.Popen(["sleep", "60"])
        Path(pid_file).write_text(str(sleeper.pid))
        raise RuntimeError("leaving a sleeping grandchild")
    dist.barrier()


def test_the_grandchildren_of_a_failed_worker_are_stopped(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    with pytest.raises(WorkerError, match="leaving a sleeping grandchild"):
        notebook_launcher(_grandchild_then_fail, args=(str(pid_file),), num_processes=2)
    pid = int(pid_file.read_text())
    try:
        deadline = time.monotonic() + 1.0
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _running(pid), "the worker's own child outlived the launch"
    finally:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


# -- the port -------------------------------------------------------------------------------


def test_the_port_cannot_be_taken_between_binding_and_forking(tmp_path, monkeypatch):
    """Each worker, first thing after the fork, tries to take the chosen port for itself."""
    run_worker = guardian.run_worker

    def squat_then_run(function, args, kwargs, spec, *rest):
        squatter = socket.socket()
        try:
            squatter.bind(("127.0.0.1", spec.master_port))
            squatter.listen()
            outcome = "taken"  # kept open: the rendezvous would now fail
        except OSError:
            outcome = "refused"
        (tmp_path / f"rank{spec.rank}").write_text(outcome)
        run_worker(function, args, kwargs, spec, *rest)

    monkeypatch.setattr(guardian, "run_worker", squat_then_run)
    assert notebook_launcher(lambda: dist.get_world_size(), num_processes=2, timeout=60) == 2
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["refused", "refused"]


# -- seeding --------------------------------------------------------------------------------


def test_the_seed_is_applied_in_every_worker():
    def draw() -> list[torch.Tensor]:
        gathered = [torch.empty(3), torch.empty(3)]
        dist.all_gather(gathered, torch.rand(3))
        return gathered

    state = torch.get_rng_state()
    try:
        torch.manual_seed(12345)  # the workers inherit this state unless the seed replaces it
        drawn = notebook_launcher(draw, num_processes=2, seed=3)
        torch.manual_seed(3)
        expected = torch.rand(3)
    finally:
        torch.set_rng_state(state)
    assert torch.equal(drawn[0], expected) and torch.equal(drawn[1], expected)


# -- the Accelerator on two processes ------------------------------------------------------


def _no_sync_then_sync() -> dict[str, bool]:
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = accelerator.prepare(nn.Linear(3, 1))
    rank_input = torch.full((2, 3), float(dist.get_rank() + 1))

    def gathered_grad() -> list[torch.Tensor]:
        grad = model.module.weight.grad.detach().clone()
        everyone = [torch.empty_like(grad) for _ in range(2)]
        dist.all_gather(everyone, grad)
        return everyone

    with accelerator.no_sync(model):
        accelerator.backward(model(rank_input).sum())
    inside = gathered_grad()
    model.zero_grad()
    accelerator.backward(model(rank_input).sum())
    synced = gathered_grad()
    return {
        "differ_inside": not torch.equal(inside[0], inside[1]),
        "equal_after": torch.equal(synced[0], synced[1]),
        "mean_after": torch.allclose(synced[0], (inside[0] + inside[1]) / 2),
    }


def test_no_sync_skips_the_all_reduce_and_a_synced_step_averages():
    assert notebook_launcher(_no_sync_then_sync, num_processes=2) == {
        "differ_inside": True,
        "equal_after": True,
        "mean_after": True,
    }


def _autocast_and_clip() -> dict[str, object]:
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = accelerator.prepare(nn.Linear(4, 2))
    with accelerator.autocast():
        product = torch.ones(2, 2) @ torch.ones(2, 2)
    output = model(torch.randn(8, 4) * (dist.get_rank() + 1))
    accelerator.backward(output.float().pow(2).sum() * 100)  # a large gradient
    grads = [p.grad.detach().clone() for p in model.parameters()]
    full_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    norm = accelerator.clip_grad_norm_(model.parameters(), 0.5)
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    values = [None, None]
    dist.all_gather_object(values, (float(norm), float(clipped)))
    return {
        "autocast": str(product.dtype),
        "forward": str(model.module.weight.dtype),
        "norm_is_the_unclipped_norm": torch.allclose(norm, full_norm),
        "clipped_to": round(float(clipped), 4),
        "same_on_every_rank": values[0] == values[1],
    }


def test_autocast_and_clip_grad_norm_on_two_processes():
    result = notebook_launcher(_autocast_and_clip, num_processes=2, mixed_precision="bf16")
    assert result == {
        "autocast": "torch.bfloat16",
        "forward": "torch.float32",  # parameters stay in float32 under autocast
        "norm_is_the_unclipped_norm": True,
        "clipped_to": 0.5,
        "same_on_every_rank": True,
    }


# -- live=False -----------------------------------------------------------------------------


def _warn_then_fail() -> None:
    print("routine output", flush=True)
    if dist.get_rank() == 1:
        print("about to fail", file=sys.stderr, flush=True)
        raise ValueError("bad input on rank one")
    dist.barrier()


def test_live_false_still_shows_errors(capsys):
    with pytest.raises(WorkerError, match="bad input on rank one") as caught:
        notebook_launcher(_warn_then_fail, num_processes=2, live=False)
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing but errors
    assert "[rank 1] about to fail" in captured.err
    assert "Traceback of rank 1" in str(caught.value)


# -- the Stop button ------------------------------------------------------------------------


class _StopPressedAtOnce(HeadlessObserver):
    """Presses Stop (sets the shared flag from the kernel) as the launch starts."""

    def on_start(self, info: Any) -> None:
        super().on_start(info)
        info.stop_flag.set()


def _loop_until_stopped() -> list[int]:
    accelerator = Accelerator()
    # A bounded count, the same on every rank: a flag never read fails instead of hanging.
    stopped_at = -1
    for step in range(1, 2001):
        if accelerator.should_stop:
            stopped_at = step
            break
        time.sleep(0.001)
    steps = [0, 0]
    dist.all_gather_object(steps, stopped_at)
    return steps


def test_stop_reaches_every_rank_at_the_same_step():
    steps = notebook_launcher(_loop_until_stopped, num_processes=2, observer=_StopPressedAtOnce())
    assert steps[0] == steps[1] > 0, steps


class _StopPressedMidRun(HeadlessObserver):
    """Presses Stop once rank 0 says it is at step 30, while rank 1 is far behind."""

    def on_metrics(self, batch: Any) -> None:
        super().on_metrics(batch)
        if self.recorder.metrics.values.get("at_step") and self.info is not None:
            self.info.stop_flag.set()  # only rank 0 logs it

    def on_start(self, info: Any) -> None:
        super().on_start(info)
        self.info = info


def _loop_at_different_speeds() -> list[int]:
    """Rank 1 steps twenty times slower: the ranks read the flag at different steps, and
    only the vote makes them stop together."""
    import notebook_kit

    accelerator = Accelerator()
    stopped_at = -1
    for step in range(1, 1001):
        if accelerator.process_index == 0 and step == 30:
            notebook_kit.log({"at_step": step}, step=step)
        if accelerator.should_stop:
            stopped_at = step
            break
        time.sleep(0.001 if accelerator.process_index == 0 else 0.02)
    steps = [0, 0]
    dist.all_gather_object(steps, stopped_at)
    return steps


def test_stop_ends_every_rank_at_the_same_step_when_they_see_it_at_different_steps():
    observer = _StopPressedMidRun()
    steps = notebook_launcher(_loop_at_different_speeds, num_processes=2, observer=observer)
    assert steps[0] == steps[1] >= 30, steps


INTERRUPT_AT_ONCE = """
import os, signal, threading, time
from notebook_kit import notebook_launcher
from notebook_kit.launch import warmup
assert warmup._thread.is_alive()  # the import's background warm-up is still running
threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    notebook_launcher(lambda: time.sleep(30), num_processes=2, live=False)
except KeyboardInterrupt:
    print("interrupted")
"""


def test_an_interrupt_right_after_import_is_not_lost():
    # Ctrl-C while the first launch waits for the import's warm-up must stop that launch.
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPT_AT_ONCE],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},
    )
    assert done.stdout.strip() == "interrupted", done.stderr[-2000:]
