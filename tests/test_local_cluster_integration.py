"""``local_cluster()``: a Dask cluster on this machine that the interrupt button leaves alone.

Jupyter interrupts by sending SIGINT to the kernel's whole process group
(``manager.interrupt_kernel()``). A cluster run interrupted that way ends with
KeyboardInterrupt; the cluster keeps its workers and the next launch on it trains. When the
kernel dies, the cluster's processes end with it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from notebook_kit import local_cluster
from tests.kernel_cells import cell_messages, real_kernel, run_cell
from tests.optional import needs

pytestmark = [pytest.mark.integration, needs("distributed", what="a local Dask cluster")]

END_BOUND_S = 60.0  # the cluster's processes end within this after the kernel dies

SETUP = """
import time
from notebook_kit import local_cluster, notebook_launcher

CLUSTER
client.wait_for_workers(2)

def train_forever(marker):
    import torch.distributed as dist
    open(marker + str(dist.get_rank()), "w").close()
    while True:
        time.sleep(0.05)

def world():
    import torch.distributed as dist
    return dist.get_world_size()
"""
LOCAL_CLUSTER = """
cluster = local_cluster(n_workers=2, threads_per_worker=1)
client = cluster.get_client()
"""
IN_KERNEL_CLUSTER = """
from distributed import Client, LocalCluster
cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
client = Client(cluster)
"""

LAUNCH = "notebook_launcher({}, cluster=client, num_nodes=2, num_processes=1, live=False)"


def _text(messages: list[dict]) -> str:
    return "".join(
        m["content"].get("text", "") or m["content"].get("data", {}).get("text/plain", "")
        for m in messages
        if m["msg_type"] in ("stream", "execute_result")
    )


def _errors(messages: list[dict]) -> list[str]:
    return [m["content"]["ename"] for m in messages if m["msg_type"] == "error"]


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _running(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            pass
    return alive


def _interrupt_a_cluster_run_then_launch(
    manager, client, setup: str, marker: str
) -> tuple[list[psutil.Process], list]:
    """Run ``setup``, interrupt a cluster run as Jupyter does once every rank runs, then
    launch again: the processes of the cluster (of ``cluster.pid``) before the interrupt, and
    the messages of that launch."""
    done = run_cell(
        client, setup + "\nprint('cluster pid', getattr(cluster, 'pid', 0))", timeout=240
    )
    assert not _errors(done), _text(done)
    pid = int(_text(done).split("cluster pid ")[1].split()[0])
    cluster = _tree(pid) if pid else []
    msg_id = client.execute(LAUNCH.format(f"train_forever, args=({marker!r},)"))
    deadline = time.monotonic() + 240
    while not all(Path(marker + str(rank)).exists() for rank in (0, 1)):
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    manager.interrupt_kernel()  # SIGINT to the kernel's process group, as Jupyter does
    interrupted = cell_messages(client, msg_id, timeout=120)
    assert _errors(interrupted) == ["KeyboardInterrupt"], _text(interrupted)
    return cluster, run_cell(client, f"print('world', {LAUNCH.format('world')})", timeout=240)


@pytest.mark.kernel
@pytest.mark.timeout(600)
def test_an_interrupt_during_a_cluster_run_leaves_the_cluster_ready_for_the_next(tmp_path):
    with real_kernel() as (manager, client):
        cluster, after = _interrupt_a_cluster_run_then_launch(
            manager, client, SETUP.replace("CLUSTER", LOCAL_CLUSTER), str(tmp_path / "r")
        )
        assert not _errors(after), _text(after)
        assert "world 2" in _text(after)
        assert len(cluster) >= 3  # the cluster's process and its two worker processes
        assert _running(cluster) == cluster  # none lost or replaced

        os.kill(manager.provisioner.process.pid, signal.SIGKILL)  # the cluster ends with it
        deadline = time.monotonic() + END_BOUND_S
        while _running(cluster) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(cluster), "the cluster outlived its kernel"


@pytest.mark.kernel
@pytest.mark.timeout(600)
def test_a_local_cluster_made_in_the_kernel_loses_its_workers_to_the_same_interrupt(tmp_path):
    """Why local_cluster exists: the same steps with Dask's LocalCluster made in the kernel."""
    with real_kernel() as (manager, client):
        _, after = _interrupt_a_cluster_run_then_launch(
            manager, client, SETUP.replace("CLUSTER", IN_KERNEL_CLUSTER), str(tmp_path / "r")
        )
        assert "world 2" not in _text(after), _text(after)
        refused = [m["content"]["evalue"] for m in after if m["msg_type"] == "error"]
        assert refused and "the cluster has 0" in refused[0], refused


def test_close_ends_every_process_of_the_cluster():
    with local_cluster(n_workers=1) as cluster:
        client = cluster.get_client()
        client.wait_for_workers(1)
        assert client.submit(sum, [1, 2]).result(timeout=60) == 3
        processes = _tree(cluster.pid)
        assert len(processes) >= 2
    assert not _running(processes)
    assert "closed" in repr(cluster)


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="processes cannot be given"):
        local_cluster(processes=False)
    with pytest.raises(ValueError, match="threads_per_worker must be an int >= 1"):
        local_cluster(threads_per_worker=0)
    with pytest.raises(TypeError, match="JSON values"):
        local_cluster(env={"A": object()})


def _listening(pid: int) -> set[tuple[str, int]]:
    """The addresses the process ``pid`` listens on (the cluster's own: its scheduler)."""
    sockets = psutil.Process(pid).net_connections(kind="inet")
    return {(s.laddr.ip, s.laddr.port) for s in sockets if s.status == psutil.CONN_LISTEN}


def test_the_dashboard_listens_on_loopback_only_and_none_means_no_http_at_all():
    with local_cluster(n_workers=0) as cluster:
        listening = _listening(cluster.pid)
        port = int(cluster.dashboard_link.split(":")[2].split("/")[0])
        assert ("127.0.0.1", port) in listening
        assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening
    with local_cluster(n_workers=0, dashboard_address=None) as cluster:
        scheduler_port = int(cluster.scheduler_address.rsplit(":", 1)[1])
        assert _listening(cluster.pid) == {("127.0.0.1", scheduler_port)}
        assert cluster.dashboard_link == ""
