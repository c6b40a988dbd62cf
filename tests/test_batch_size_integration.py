"""find_executable_batch_size across real forked ranks: one size, agreed through restarts.

Rank 1 runs out of memory in its forward while rank 0 already waits for it in DDP's gradient
all-reduce, the case where each rank searching alone hangs: the launch restarts both at half
the size, and both end on the same size. A pool, whose ranks cannot be restarted without
losing their state, refuses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from notebook_kit import WorkerError, WorkerPool, find_executable_batch_size, notebook_launcher
from notebook_kit.runtime.context import current_launch
from tests.processes import clean_environment

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


class _Model(torch.nn.Module):
    """A linear layer whose forward on rank 1 runs out of memory above ``fits`` samples."""

    def __init__(self, fits: int) -> None:
        super().__init__()
        self.fits = fits
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if dist.get_rank() == 1 and inputs.shape[0] > self.fits:
            raise torch.OutOfMemoryError(f"CUDA out of memory at {inputs.shape[0]} (test)")
        return self.linear(inputs)


def _search(folder: Path, fits: int, start: int) -> tuple[int, int]:
    """One DDP step: rank 1 runs out of memory in its forward once rank 0 is in its backward,
    where DDP's gradient all-reduce waits for rank 1."""

    @find_executable_batch_size(starting_batch_size=start)
    def step(batch_size: int) -> tuple[int, int]:
        context = current_launch()
        assert context is not None
        model = torch.nn.parallel.DistributedDataParallel(_Model(fits))
        tried = folder / f"{context.restart_count}-{context.rank}-{batch_size}"
        if context.rank == 1:  # until rank 0 is in its backward's all-reduce
            waiting = folder / f"{context.restart_count}-0-{batch_size}"
            deadline = time.monotonic() + 20
            while not waiting.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)
        tried.touch()
        model(torch.ones(batch_size, 4)).sum().backward()
        total = torch.tensor([batch_size])
        dist.all_reduce(total)  # both ranks: the same size, so twice it
        return batch_size, int(total)

    return step()


@pytest.mark.timeout(150)
def test_rank_1_out_of_memory_while_rank_0_waits_in_all_reduce_restarts_both_at_half(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    value = notebook_launcher(
        _search, (tmp_path, 16, 64), num_processes=2, max_restarts=0, timeout=60, live=False
    )
    assert value == (16, 32)  # rank 0's value: the size both ran, summed over both
    tried = {path.name for path in tmp_path.iterdir()}
    # Each attempt, both ranks at one size: 64, then 32, then 16; max_restarts=0 not charged.
    assert tried == {f"{attempt}-{rank}-{size}" for attempt, size in enumerate((64, 32, 16))
                     for rank in (0, 1)}  # fmt: skip
    said = capfd.readouterr().out
    assert "rank 1 ran out of memory at batch size 64: restarting every rank at 32" in said
    assert "rank 1 ran out of memory at batch size 32: restarting every rank at 16" in said


@pytest.mark.timeout(150)
def test_a_search_that_reaches_zero_ends_the_launch_naming_the_function(tmp_path: Path) -> None:
    with pytest.raises(WorkerError, match=r"reached zero\. step ran out .*starting_batch_size=2"):
        notebook_launcher(_search, (tmp_path, 0, 2), num_processes=2, timeout=120, live=False)
    tried = {path.name for path in tmp_path.iterdir()}
    assert {"0-1-2", "1-1-1"} <= tried and not any(name.endswith("-0") for name in tried)


TEMPLATE_PATH = textwrap.dedent(
    """
    import pathlib, sys
    import torch.distributed as dist
    from notebook_kit import notebook_launcher
    from tests.test_batch_size_integration import _search

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    folder = pathlib.Path(sys.argv[1])
    print("value", notebook_launcher(_search, (folder, 16, 32), num_processes=2, timeout=120))
    dist.destroy_process_group()
    """
)


@pytest.mark.timeout(150)
def test_workers_started_from_the_clean_template_agree_on_the_size_too(tmp_path: Path) -> None:
    folder = tmp_path / "tried"
    folder.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", TEMPLATE_PATH, str(folder)],
        env=clean_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=140,
        cwd=Path(__file__).parent.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "starting workers from a clean process" in done.stdout  # the template's path
    assert "rank 1 ran out of memory at batch size 32: restarting every rank at 16" in done.stdout
    assert "value (16, 32)" in done.stdout
    assert {path.name for path in folder.iterdir()} == {"0-0-32", "0-1-32", "1-0-16", "1-1-16"}


def _decorated_step() -> int:
    @find_executable_batch_size(starting_batch_size=8)
    def step(batch_size: int) -> int:
        return batch_size

    return step()


@pytest.mark.timeout(150)
def test_a_pool_refuses_a_search_on_several_ranks_and_keeps_its_workers() -> None:
    pool = WorkerPool(num_processes=2, live=False)
    try:
        pids = pool.pids
        pool.run_cell("kept = 41")
        with pytest.raises(WorkerError) as refused:
            pool.run(_decorated_step)
        message = str(refused.value)
        assert "find_executable_batch_size of step cannot search" in message
        assert "notebook_launcher(function, num_processes=2)" in message
        assert pool.run(lambda: os.getpid(), ranks="all") == pids
        assert pool.run_cell("kept + 1") == 42
    finally:
        pool.close()
