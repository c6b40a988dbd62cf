"""SIGTERM to every process of a launch but the kernel, as a preempted VM's shutdown or a SLURM
job at its time limit sends it: the ranks are not killed, ``should_stop()`` turns True on
every rank at the same step with the reason, and the function saves and returns. The launch's
own SIGTERM (stopping its workers after a failure) still ends them at once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import notebook_kit
from notebook_kit import notebook_launcher

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


def _until_told(project: str, marks: str):
    from notebook_kit import Accelerator

    accelerator = Accelerator(project_dir=project)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    Path(marks, f"rank-{dist.get_rank()}").write_text(f"{os.getpid()} {os.getppid()}")
    for step in range(100_000):
        dist.all_reduce(torch.ones(1))
        model(torch.ones(1, 2)).sum().backward()
        time.sleep(0.01)
        if notebook_kit.should_stop():
            accelerator.save_state()
            Path(marks, f"stopped-{dist.get_rank()}").write_text(str(step))
            return step, notebook_kit.stop_reason()
    raise RuntimeError("should_stop() never turned True")


def test_sigterm_to_the_ranks_and_guardian_lets_every_rank_save_at_the_same_step(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()

    def preempt() -> None:  # every process below the kernel, as a VM shutdown does
        deadline = time.monotonic() + 60
        while not all((marks / f"rank-{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        pids = {int(p) for r in (0, 1) for p in (marks / f"rank-{r}").read_text().split()}
        for pid in pids:  # both ranks and their guardian
            os.kill(pid, signal.SIGTERM)

    sender = threading.Thread(target=preempt, daemon=True)
    sender.start()
    step, reason = notebook_launcher(
        _until_told, args=(str(tmp_path / "project"), str(marks)), num_processes=2, live=False
    )
    sender.join()
    assert (marks / "stopped-0").read_text() == (marks / "stopped-1").read_text() == str(step)
    assert reason.startswith("node 0 received SIGTERM"), reason
    assert (tmp_path / "project" / "checkpoints" / "checkpoint_0" / "checkpoint.json").exists()
    assert notebook_kit.last_run().stopped


def _rank_1_fails_while_rank_0_sleeps():
    if dist.get_rank() == 1:
        time.sleep(0.5)
        raise RuntimeError("rank 1 gives up")
    while True:
        time.sleep(0.05)  # in Python between sleeps: a handler runs at once


def test_the_launchs_own_sigterm_still_ends_a_worker_at_once():
    from notebook_kit import WorkerError

    with pytest.raises(WorkerError, match="rank 1 gives up"):
        notebook_launcher(_rank_1_fails_while_rank_0_sleeps, num_processes=2, live=False)
    # SIGTERM ended rank 0 (not SIGKILL after the grace): it did not take it for preemption.
    assert notebook_kit.last_run().exit_codes[0] == -signal.SIGTERM
