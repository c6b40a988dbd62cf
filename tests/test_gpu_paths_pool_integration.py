"""A pool laid out as under nccl (the stop vote and the health check on a gloo group of their
own), on the CPU: groups are not piled up per cell, an orphaned collective is found, and a
restart from a tainted kernel is refused without losing the workers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from notebook_kit import ForkSafetyError, WorkerError, WorkerPool
from notebook_kit.config import environment
from notebook_kit.runtime import process_group

pytestmark = [pytest.mark.integration]

SETUP = (
    "import torch, torch.distributed as dist, notebook_kit\n"
    "rank = dist.get_rank()\n"
    "groups = lambda: len(dist.distributed_c10d._world.pg_map)"
)


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerPool]:
    # The workers inherit this through the fork: the CPU collectives get a group of their own,
    # as they do beside nccl, though the default group here is gloo. "fork", never the clean
    # template ("auto" would take it for a restart from a tainted kernel, below).
    monkeypatch.setattr(process_group, "_needs_cpu_group", lambda: True)
    shared = WorkerPool(num_processes=2, live=False, start_method="fork")
    shared.run_cell(SETUP)
    yield shared
    shared.close()


def test_the_group_count_stays_flat_over_fifty_pool_cells(pool: WorkerPool) -> None:
    pool.run_cell("notebook_kit.should_stop()")  # the first vote makes the CPU group
    before = pool.run_cell("groups()")
    for _ in range(50):
        assert pool.run_cell("notebook_kit.should_stop()") is False
    assert pool.run_cell("groups()") == before


def test_a_collective_one_rank_left_unmatched_is_found_and_the_workers_restarted(
    pool: WorkerPool,
) -> None:
    # Under nccl a collective is only queued: the CPU check passes while it waits for ever.
    cell = (
        "if rank == 0:\n"
        "    pending = dist.all_reduce(torch.ones(7), async_op=True)\n"
        "    raise ValueError('left behind')"
    )
    with pytest.raises(WorkerError, match="started different numbers of collectives") as raised:
        pool.run_cell(cell)
    assert "out of step" in str(raised.value) and pool.pids == []
    pool.run_cell(SETUP)  # new workers, in step
    assert pool.run_cell("t = torch.tensor([rank + 1.0]); dist.all_reduce(t); t.item()") == 3.0


def test_restart_refuses_a_kernel_that_can_no_longer_fork_and_keeps_the_workers(
    pool: WorkerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = pool.pids
    pool.run_cell("kept = 41")
    # What the fork probe's child sees after cupy or a bare cuInit in the kernel.
    monkeypatch.setattr(environment, "_cuda_compiled", lambda: True)
    monkeypatch.setattr(environment, "_driver_init_status", lambda: 3)
    monkeypatch.setattr(environment, "_gpus_seen", {})
    with pytest.raises(ForkSafetyError, match="A library other than torch created a CUDA"):
        pool.restart()
    assert pool.pids == pids
    assert pool.run_cell("kept + 1") == 42
