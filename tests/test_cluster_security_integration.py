"""What a third party on the scheduler can no longer do, on a real Dask ``LocalCluster``.

A second process with a plain ``distributed.Client`` to the same scheduler
(``tests/cluster_attacker.py``) finds a run's topics with ``get_events`` and posts pickles
that would create a marker file wherever they were unpickled: during a launch, and to an idle
cluster pool before its next call (on its event topic and its command topic). Nothing runs,
the run goes on, and the kernel warns once, naming the topic. A cluster pool's answers leave
their node at once, and a launch runs on a cluster with TLS (``Security.temporary()``).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from notebook_kit import WorkerPool, notebook_launcher
from notebook_kit.node.protocol import Seal
from tests.optional import needs
from tests.test_cluster_integration import assert_nothing_left, local_cluster

pytestmark = [pytest.mark.integration, needs("distributed", what="cluster runs")]

_ATTACK_SECONDS = 150  # the attacker's process imports distributed and torch on 2 busy cores


@pytest.fixture(scope="module")
def client():
    with local_cluster() as client:
        yield client


def attack(kind: str, address: str, marker: Path) -> list[str]:
    """Run the third party to the end; the topics (or Ray runs) it posted to."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.cluster_attacker", kind, address, str(marker)],
        capture_output=True, text=True, timeout=_ATTACK_SECONDS, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def forgery_warnings(caught: list[warnings.WarningMessage], topic: str) -> list[str]:
    return [str(w.message) for w in caught if topic in str(w.message)]


def _wait_for_file(path: str) -> int:
    deadline = time.monotonic() + _ATTACK_SECONDS
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)
    return 42


def _specs_holding(secret: bytes, dask_scheduler=None) -> list[str]:
    """On the scheduler: the tasks whose spec holds ``secret``."""
    import cloudpickle

    return [
        str(key)
        for key, task in dask_scheduler.tasks.items()
        if secret in cloudpickle.dumps(task.run_spec)
    ]


def test_a_forged_event_during_a_launch_runs_nothing_and_the_launch_returns(
    client, tmp_path, monkeypatch
):
    """The run's secret is on the node's worker, never in what the scheduler holds."""
    marker, done = tmp_path / "ran-in-the-kernel", tmp_path / "attack-done"
    posted: list[str] = []
    secrets: list[bytes] = []
    made = Seal.new

    def seal_seen() -> Seal:  # the kernel's seal, as it is made
        seal = made()
        secrets.append(seal.secret)
        return seal

    monkeypatch.setattr(Seal, "new", staticmethod(seal_seen))
    on_scheduler: list[list[str]] = []

    def third_party() -> None:
        try:
            posted.extend(attack("dask", client.scheduler.address, marker))
            on_scheduler.append(client.run_on_scheduler(_specs_holding, secrets[0]))
        finally:
            done.touch()  # the ranks return once the forgeries were posted

    thread = threading.Thread(target=third_party, daemon=True)
    thread.start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = notebook_launcher(
            _wait_for_file, args=(str(done),), num_processes=1, num_nodes=2, cluster=client,
            live=False,
        )  # fmt: skip
    thread.join(timeout=10)
    assert result == 42
    assert not marker.exists()
    assert on_scheduler == [[]]  # (looked for while the nodes ran)
    (topic,) = [name for name in posted if name.endswith("-events")]
    assert len(forgery_warnings(caught, topic)) == 1, [str(w.message) for w in caught]
    assert_nothing_left(client)


@pytest.fixture(scope="module")
def pool(client):
    with WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False) as shared:
        yield shared
    assert_nothing_left(client)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def test_forged_events_and_commands_to_an_idle_pool_run_nothing(pool, client, tmp_path):
    marker = tmp_path / "ran-somewhere"
    assert pool.run(_rank, ranks="all") == [0, 1]  # its command topic exists now
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        posted = attack("dask", client.scheduler.address, marker)  # while the pool is idle
        assert pool.run(_rank, ranks="all") == [0, 1]
        time.sleep(0.5)  # a forged command would have reached the ranks by now
        assert pool.run(_rank, ranks="all") == [0, 1]
    assert not marker.exists()
    (topic,) = [name for name in posted if name.endswith("-events")]
    assert [name for name in posted if name.endswith("-commands")]
    assert len(forgery_warnings(caught, topic)) == 1, [str(w.message) for w in caught]


def test_twenty_calls_on_a_cluster_pool_each_answer_at_once(pool):
    """A node sends its answer the moment it has it, not with its next batch of lines."""
    pool.run(_rank)  # warm
    started = time.monotonic()
    for _ in range(20):
        pool.run(_rank)
    elapsed = time.monotonic() - started
    assert elapsed < 3.0, f"20 calls took {elapsed:.2f} s: answers waited for a batch"


def test_a_launch_runs_on_a_cluster_with_tls(tmp_path):
    from distributed import Client, LocalCluster
    from distributed.security import Security

    security = Security.temporary()
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(
            LocalCluster(
                n_workers=1,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                security=security,
            )
        )
        tls = stack.enter_context(Client(cluster, security=security))
        assert cluster.scheduler_address.startswith("tls://")
        result = notebook_launcher(
            _sum_of_ranks, num_processes=2, num_nodes=1, cluster=tls, live=False
        )
    assert result == 1.0


def _sum_of_ranks() -> float:
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    return total.item()
