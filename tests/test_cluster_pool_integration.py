"""``WorkerPool(cluster=client)`` does what a local pool does, on a real Dask LocalCluster.

Every pool verb (run, run_cell, push, pull, restart, close), models coming home, the record
of each run, the Stop button, a timeout, and twenty cells that leave nothing growing on the
scheduler, the workers or the kernel. Two nodes of one rank each, as in
``tests/test_cluster_integration.py``, whose helpers count what is left.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from notebook_kit import WorkerError, WorkerPool, last_run
from tests.optional import needs
from tests.test_cluster_integration import (
    assert_nothing_left,
    local_cluster,
    node_processes,
)

pytestmark = [pytest.mark.integration, needs("distributed", what="cluster pools")]

SETUP = "import os, time, torch, torch.distributed as dist\nrank = dist.get_rank()"


@pytest.fixture(scope="module")
def client():
    with local_cluster() as client:
        yield client


@pytest.fixture(scope="module")
def pool(client):
    main = sys.modules["__main__"]
    main.defined_before_the_pool = 40  # a notebook global the nodes never inherited
    try:
        shared = WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False)
        shared.run_cell(SETUP)
        yield shared
    finally:
        del main.defined_before_the_pool
    shared.close()
    assert shared.pids == [] and "closed" in repr(shared)
    assert_nothing_left(client)


def test_a_timeout_interrupts_every_node_and_keeps_the_pool(client):
    """First: the module's shared pool, started by the next test, takes every worker's thread."""
    with WorkerPool(cluster=client, num_nodes=2, num_processes=1, timeout=2.0, live=False) as timed:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"timeout=2\.0"):
            timed.run_cell("import time\nfor _ in range(600):\n    time.sleep(0.1)")
        assert time.monotonic() - started < 15
        assert timed.run_cell("6 * 7") == 42
    assert_nothing_left(client)


def test_cells_push_and_pull_work_with_global_ranks(pool, capsys, monkeypatch):
    assert pool.world_size == 2 and pool.num_processes == 1
    assert "2 Dask workers" in pool.where and "world size 2" in pool.where
    pool.push(scale=0.5, weights=torch.arange(3.0))
    assert pool.run_cell("value = scale * (rank + 1)\nvalue") == 0.5
    assert pool.pull("value", rank=1) == 1.0  # the second node's rank
    assert torch.equal(pool.pull("weights", rank=1), torch.arange(3.0))
    assert pool.run_cell("value;") is None  # a trailing ; hides the value, as in a notebook
    # Notebook globals a cell uses are sent: the nodes hold nothing of this kernel's.
    monkeypatch.setattr(sys.modules["__main__"], "from_the_kernel", 1, raising=False)
    assert pool.run_cell("defined_before_the_pool + from_the_kernel + rank + 1") == 42
    pool.run_cell("print('hello from', rank, os.environ.get('NK_CLUSTER_TEST_RUN') is not None)")
    out = capsys.readouterr().out
    assert "[rank 0 · node 0]\nhello from 0 True\n[rank 1 · node 1]\nhello from 1 True" in out
    with pytest.raises(ValueError, match="rank"):
        pool.pull("value", rank=2)


def test_a_failing_cell_names_the_rank_and_its_node_and_keeps_the_pool(pool):
    with pytest.raises(WorkerError) as caught:
        pool.run_cell("if rank == 1:\n    raise KeyError('only on node 1')\nrank")
    message = str(caught.value)
    assert f"Rank 1 (node 1, Dask worker {caught.value.nodes[1]}) of 2 failed" in message
    assert "KeyError" in message and "still running" in message, message
    assert pool.run_cell("rank + 10") == 10  # the same ranks, their names kept


def _train(model):
    from notebook_kit import Accelerator, log

    accelerator = Accelerator()
    prepared = accelerator.prepare(model)
    for step in range(3):
        log({"loss": float(dist.get_rank() + step)}, step=step)
    with torch.no_grad():
        prepared.module.weight.fill_(3.0 + dist.get_rank())
    return accelerator.process_index


def test_a_kernel_model_comes_home_with_global_rank_0s_weights_and_the_run_is_recorded(pool):
    model = torch.nn.Linear(2, 1)
    assert pool.run(_train, model) == 0
    assert torch.all(model.weight == 3.0)  # rank 0's, loaded into this very object
    record = last_run()
    assert record is not None and record.succeeded
    assert len(record.metrics["loss"]) == 3
    assert sorted(r.rank for r in record.ranks) == [0, 1]


def _until_stopped(marker: str) -> int:
    import notebook_kit

    Path(f"{marker}{dist.get_rank()}").touch()
    steps = 0
    while not notebook_kit.should_stop():  # a collective vote: every rank ends at one step
        steps += 1
        time.sleep(0.01)
        if steps == 3000:  # never stopped: the test fails, without a hang
            return -1
    return steps


def test_the_stop_button_ends_the_run_on_every_node_at_the_same_step(pool, tmp_path):
    marker = str(tmp_path / "running-")

    def press() -> None:
        deadline = time.monotonic() + 60
        while not all(Path(f"{marker}{r}").exists() for r in range(2)):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        pool._stop_flag.set()  # what the live view's Stop button sets

    presser = threading.Thread(target=press)
    presser.start()
    steps = pool.run(_until_stopped, marker, ranks="all")
    presser.join()
    assert steps[0] == steps[1] > 0
    record = last_run()
    assert record is not None and record.stopped
    assert pool.run_cell("rank") == 0  # the next run is not stopped


def counts() -> tuple[int, int, int]:
    """Descriptors other than sockets, sockets, threads."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    sockets = sum(link.startswith("socket:") for link in links)
    return len(links) - sockets, sockets, threading.active_count()


def test_twenty_cells_leave_nothing_growing(pool, client):

    def on_scheduler(dask_scheduler=None) -> tuple[int, int]:
        variables = dask_scheduler.extensions["variables"].variables
        return len(dask_scheduler._broker._topics), len(variables)

    for index in range(3):  # the first runs warm caches (imports, connections)
        pool.run_cell(f"value = {index}")
    workers = client.run(counts)
    ranks = pool.run(counts, ranks="all")
    scheduler = client.run_on_scheduler(on_scheduler)
    kernel, nodes = counts(), sorted(node_processes())  # (the client's connections are open)
    for index in range(20):
        pool.run_cell(f"value = {index}")
    assert pool.run_cell("value") == 19
    # A Dask client keeps a pool of connections, which may open one more socket once;
    # anything a command leaked would grow by twenty.
    files, sockets, threads = counts()
    assert files <= kernel[0] and threads <= kernel[2] and sockets <= kernel[1] + 2, kernel
    assert pool.run(counts, ranks="all") == ranks
    assert client.run_on_scheduler(on_scheduler) == scheduler
    assert sorted(node_processes()) == nodes
    # A Dask worker opens a descriptor or a thread of its own now and then (its executor, its
    # connections); one a command leaked would show twenty times.
    after = client.run(counts)
    for worker, (files, sockets, threads) in after.items():
        before = workers[worker]
        grown = (files - before[0], sockets - before[1], threads - before[2])
        assert max(grown) <= 2, (workers, after)


def test_restart_starts_new_nodes_that_hold_nothing(pool, client):
    """Last of the shared pool's tests: its ranks lose what they held."""
    pool.run_cell("kept = 1")
    before = pool.pids
    pool.restart()
    assert pool.pids and set(pool.pids).isdisjoint(before)
    with pytest.raises(WorkerError, match="NameError"):
        pool.run_cell("kept")
    assert pool.run_cell("import torch.distributed as dist\ndist.get_world_size()") == 2
    assert pool.restarts == 1
    pool.close()  # a closed cluster pool starts new nodes too
    pool.restart()
    assert pool.run_cell("import torch.distributed as dist\ndist.get_world_size()") == 2
    assert not pool.closed and pool.restarts == 2
