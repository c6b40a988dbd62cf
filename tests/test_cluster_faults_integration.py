"""Cluster runs on a real Dask LocalCluster where a local launch and a cluster run could part:
FSDP's weights and non-zero ranks' values, every setting reaching every rank, the stall
report, and a pool losing a Dask worker.

The module shares one LocalCluster (the fixture of ``tests/test_cluster_integration.py``);
the test that kills a Dask worker comes last.
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

from notebook_kit import notebook_launcher
from notebook_kit.errors import WorkerError
from tests.optional import needs
from tests.test_cluster_integration import (
    WORKER_DEATH_BOUND_S,
    assert_nothing_left,
    local_cluster,
)

pytestmark = [pytest.mark.integration, needs("distributed", what="cluster runs")]


@pytest.fixture(scope="module")
def client():
    with local_cluster() as client:
        yield client


def _observe():
    """What every rank sees of the launch's settings; only rank 0's value goes home (the
    other returns a lock, which cannot be pickled)."""
    names = ("MIXED_PRECISION", "GRADIENT_ACCUMULATION_STEPS", "USE_FSDP")
    seen = {name: os.environ[f"NOTEBOOK_KIT_{name}"] for name in names}
    seen.update(threads=torch.get_num_threads(), seed=torch.initial_seed())
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, seen)
    return everyone if dist.get_rank() == 0 else threading.Lock()


def test_every_setting_given_reaches_every_rank_of_every_node(client):
    everyone = notebook_launcher(
        _observe, num_processes=1, num_nodes=2, cluster=client, mixed_precision="bf16",
        gradient_accumulation_steps=3, fsdp=True, seed=7, threads_per_process=2, live=False,
    )  # fmt: skip
    expected = {
        "MIXED_PRECISION": "bf16",
        "GRADIENT_ACCUMULATION_STEPS": "3",
        "USE_FSDP": "yes",
        "threads": 2,  # by default, the two nodes of this host share its 2 cores: 1 each
        "seed": 7,
    }
    assert everyone == [expected] * 2
    assert_nothing_left(client)


def _train_sharded(model):
    from notebook_kit import Accelerator
    from tests.fsdp_models import batches, lm_loss

    accelerator = Accelerator()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer = accelerator.prepare(model, optimizer)
    for tokens in batches(3, 1):
        accelerator.backward(lm_loss(model, tokens))
        optimizer.step()
        optimizer.zero_grad()
    state = accelerator.get_state_dict(model)  # a collective: the whole state on rank 0 only
    if dist.get_rank() != 0:
        return threading.Lock()
    return accelerator.is_fsdp2, {key: value.clone() for key, value in state.items()}


def test_fsdp_on_two_nodes_brings_global_rank_0s_whole_weights_home_once(client):
    from tests.fsdp_models import TinyLM

    model = TinyLM()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    sharded, trained = notebook_launcher(
        _train_sharded, args=(model,), num_processes=1, num_nodes=2, cluster=client, fsdp=True,
        live=False,
    )  # fmt: skip
    assert sharded
    after = model.state_dict()
    assert after.keys() == trained.keys() == before.keys()
    assert all(torch.equal(after[key], trained[key]) for key in after)
    assert not torch.equal(after["blocks.0.up.weight"], before["blocks.0.up.weight"])
    assert_nothing_left(client)


def _rank_1_waits_in_silence():
    # The line is progress: a report of a slow start (the group forming) comes before it.
    print("in the group", flush=True)
    if dist.get_rank() == 1:
        time.sleep(6)  # no output, no collective: rank 0 waits for it in the barrier
    dist.barrier()
    return dist.get_rank()


def test_the_stall_report_of_every_node_shows_in_the_kernel(client, capsys):
    value = notebook_launcher(
        _rank_1_waits_in_silence, num_processes=1, num_nodes=2, cluster=client,
        stall_seconds=1.0, live=False,
    )  # fmt: skip
    assert value == 0
    out = capsys.readouterr().out
    assert "No rank has made progress for" in out, out
    assert "rank 0: waiting in dist.barrier" in out, out
    assert "rank 1: not in a collective" in out, out
    assert_nothing_left(client)


def test_a_cluster_pool_shows_the_stall_report_of_every_node_too(client, capsys):
    from notebook_kit import WorkerPool

    pool = WorkerPool(cluster=client, num_nodes=2, num_processes=1, stall_seconds=1.0, live=False)
    try:
        assert pool.run(_rank_1_waits_in_silence) == 0
    finally:
        pool.close()
    out = capsys.readouterr().out
    assert "No rank has made progress for" in out, out
    assert "rank 1: not in a collective" in out, out
    assert_nothing_left(client)


def _sleep_on_every_rank(started: str):
    Path(f"{started}{dist.get_rank()}").touch()
    for _ in range(600):
        time.sleep(0.1)


def test_a_pool_that_loses_a_dask_worker_says_one_true_thing_about_what_remains(client, tmp_path):
    from notebook_kit import WorkerPool
    from notebook_kit.launch.cluster.pool import CLOSED

    pids = client.run(os.getpid)
    worker_1 = sorted(pids)[1]  # nodes are the workers in address order (one host)
    started = str(tmp_path / "started-")
    pool = WorkerPool(cluster=client, num_nodes=2, num_processes=2, live=False)

    def kill_when_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(os.path.exists(f"{started}{rank}") for rank in range(4)):
                os.kill(pids[worker_1], signal.SIGKILL)
                kill_when_running.at = time.monotonic()
                return
            time.sleep(0.05)

    kill_when_running.at = None
    killer = threading.Thread(target=kill_when_running)
    killer.start()
    try:
        with pytest.raises(WorkerError) as caught:
            pool.run(_sleep_on_every_rank, started)
    finally:
        killer.join()
        pool.close()
    assert kill_when_running.at is not None
    assert time.monotonic() - kill_when_running.at < WORKER_DEATH_BOUND_S
    message, error = str(caught.value), caught.value
    assert error.rank == 2 and error.lost_nodes == (1,)  # node 1's first rank, of 2 per node
    assert f"Rank 2 (node 1, Dask worker {error.nodes[1]}) of 4 failed: node 1 lost" in message
    assert CLOSED in message
    assert "still usable" not in message and "run again" not in message, message
    assert "run the cell again" not in message, message
    client.wait_for_workers(2, timeout=60)  # the nanny restarts it
    assert_nothing_left(client)
