"""The pre-flight probe on a real Dask LocalCluster listening on IPv6 (``[::1]``).

A cluster whose workers have IPv6 addresses trains; a worker whose only thread runs the
user's own Dask task is named at once, and only that worker.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from notebook_kit import notebook_launcher, notebook_launcher_async
from notebook_kit.launch.cluster.engines.dask import choose_workers, current_workers
from notebook_kit.launch.cluster.probing import PROBE_TIMEOUT_SECONDS, ClusterSetupError
from tests.optional import needs

pytestmark = [pytest.mark.integration, needs("distributed", what="cluster runs")]


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            host="[::1]",
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        yield client


def _all_reduce():
    import torch
    import torch.distributed as dist

    total = torch.ones(1)
    dist.all_reduce(total)
    return float(total)


def test_an_ipv6_cluster_trains(client):
    assert all(w.startswith("tcp://[::1]:") for w in current_workers(client))
    value = notebook_launcher(_all_reduce, cluster=client, num_nodes=2, num_processes=1, live=False)
    assert value == 2.0


def _hold(name: str) -> str:
    from distributed import Event

    Event(name).wait(timeout=120)
    return "held"


async def _launch_within(seconds: float, client) -> None:
    """The launch, ended (with ``TimeoutError``) if it waits longer than ``seconds``."""
    launch = notebook_launcher_async(
        _all_reduce, cluster=client, num_nodes=2, num_processes=1, live=False
    )
    await asyncio.wait_for(launch, seconds)


@pytest.mark.timeout(PROBE_TIMEOUT_SECONDS + 60)
def test_a_worker_busy_with_the_users_own_task_is_named_at_once_and_alone(client):
    from distributed import Event

    idle, busy = choose_workers(current_workers(client), 2)
    release = Event("nk-probe-test-hold", client=client)
    held = client.submit(_hold, release.name, workers=[busy], pure=False)
    try:
        while not client.processing([busy])[busy]:  # the worker has been given the task
            time.sleep(0.05)
        with pytest.raises(ClusterSetupError) as refused:  # the silence this replaces lasted
            asyncio.run(_launch_within(PROBE_TIMEOUT_SECONDS - 20, client))  # the probe's bound
    finally:
        release.set()
    assert held.result(timeout=60) == "held"
    message = str(refused.value)
    assert f"Dask worker {busy} has no free thread" in message
    assert idle not in message
    assert "_hold" in message  # the task that holds it
