"""``notebook_kit.stacks()`` during a cluster run: the request travels to each node.

A Dask ``LocalCluster`` of two worker processes, one rank on each: rank 0 (node 0) sleeps in
C, rank 1 (node 1) waits in ``dist.all_reduce`` for it. The kernel cannot signal them: its
request goes out in the control value, each node task passes it to its node process, which
asks its own rank and sends the text home. Then the run is interrupted and nothing is left.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

import notebook_kit
from notebook_kit import WorkerPool, notebook_launcher
from notebook_kit.launch.stack_requests import RankStacks
from tests.optional import needs
from tests.test_cluster_integration import assert_nothing_left, local_cluster
from tests.test_stacks_integration import SLACK, TIMEOUT, _both_in_place, _sleep_or_reduce
from tests.test_step_profile_integration import _profile_when_running

pytestmark = [pytest.mark.integration, needs("distributed", what="cluster runs")]


@pytest.fixture(scope="module")
def client():
    with local_cluster() as client:
        yield client


def _asker(found: list[tuple[RankStacks, float]]) -> threading.Thread:
    """Ask from another thread until both ranks are in place, then Ctrl-C the main thread."""

    def ask_then_interrupt() -> None:
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                started = time.monotonic()
                try:
                    answer = notebook_kit.stacks(TIMEOUT)
                except RuntimeError:  # the nodes have not started yet
                    time.sleep(0.1)
                    continue
                found.append((answer, time.monotonic() - started))
                if _both_in_place(answer):
                    return
                time.sleep(0.2)
        finally:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    thread = threading.Thread(target=ask_then_interrupt, daemon=True)
    thread.start()
    return thread


def _check(found: list[tuple[RankStacks, float]]) -> None:
    assert found, "stacks() never answered"
    answer = found[-1][0]
    assert _both_in_place(answer), str(answer)
    assert sorted(answer) == [0, 1]
    assert "waiting in dist.all_reduce" in answer[1] and "in _sleep_or_reduce" in answer[0]
    assert all(seconds < TIMEOUT + SLACK for _, seconds in found), [s for _, s in found]


def test_stacks_of_a_cluster_run_come_from_every_node_within_the_timeout(client) -> None:
    found: list[tuple[RankStacks, float]] = []
    thread = _asker(found)
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(
            _sleep_or_reduce, num_processes=1, num_nodes=2, cluster=client, timeout=120
        )
    thread.join(5)
    _check(found)
    assert_nothing_left(client)


def test_stacks_during_a_cluster_pool_command_come_from_every_node(client) -> None:
    found: list[tuple[RankStacks, float]] = []
    with WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False) as pool:
        pool.run(lambda: 1)  # the nodes are up: the next command is the one asked
        thread = _asker(found)
        with pytest.raises(KeyboardInterrupt):
            pool.run(_sleep_or_reduce)
        thread.join(5)
    _check(found)
    assert_nothing_left(client)


def _train_steps(total: int) -> int:
    """A prepared loader's batches, ``total`` steps: the steps profile() counts."""
    import torch

    from notebook_kit.accelerator import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps = 0
    while steps < total:
        for inputs, targets in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(inputs), targets))
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            time.sleep(0.01)
    return steps


def test_profile_of_a_cluster_run_comes_from_every_node(client, tmp_path) -> None:
    found: dict = {}
    asker = threading.Thread(
        target=_profile_when_running, args=(found, threading.Event(), tmp_path)
    )
    asker.start()
    ran = notebook_launcher(
        _train_steps, args=(400,), num_processes=1, num_nodes=2, cluster=client, live=False
    )
    asker.join(10)
    assert ran == 400
    results = found.get("profile")
    assert results is not None, found
    assert sorted(results) == [0, 1]
    for rank, result in results.items():  # each written on its node (this machine, here)
        assert result.trace == tmp_path / f"profile_{rank}.json" and result.steps == 3
        names = {e.get("name") for e in json.loads(result.trace.read_text())["traceEvents"]}
        assert {"ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"} <= names, rank
        assert len(result.table) == 10 and len(result.step_spans) == 3
    record = notebook_kit.last_run()
    assert record is not None and record.profile == results
    assert_nothing_left(client)


def test_profile_during_a_cluster_pool_command_comes_from_every_node(client, tmp_path) -> None:
    found: dict = {}
    with WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False) as pool:
        pool.run(lambda: 1)  # the nodes are up: the next command is the one asked
        asking = (found, threading.Event(), tmp_path)
        asker = threading.Thread(target=_profile_when_running, args=asking)
        asker.start()
        assert pool.run(_train_steps, 400) == 400
        asker.join(10)
    results = found.get("profile")
    assert results is not None, found
    assert sorted(results) == [0, 1] and all(r.steps == 3 for r in results.values())
    assert all(r.trace.exists() for r in results.values())
    assert_nothing_left(client)
