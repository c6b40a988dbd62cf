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

cluster = local_cluster(n_workers=2, threads_per_worker=1)
client = cluster.get_client()
client.wait_for_workers(2)

def train_forever(marker):
    import torch.distributed as dist
    open(marker + str(dist.get_rank()), "w").close()
    while True:
        time.sleep(0.05)

def world():
    import torch.distributed as dist
    return dist.get_world_size()

print("cluster pid", cluster.pid)
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


@pytest.mark.kernel
@pytest.mark.timeout(600)
def test_an_interrupt_during_a_cluster_run_leaves_the_cluster_ready_for_the_next(tmp_path):
    marker = str(tmp_path / "started-")
    with real_kernel() as (manager, client):
        setup = run_cell(client, SETUP, timeout=240)
        assert not _errors(setup), _text(setup)
        cluster = _tree(int(_text(setup).split("cluster pid ")[1].split()[0]))
        assert len(cluster) >= 3  # the cluster's process and its two worker processes

        msg_id = client.execute(LAUNCH.format(f"train_forever, args=({marker!r},)"))
        deadline = time.monotonic() + 240
        while not all(Path(marker + str(rank)).exists() for rank in (0, 1)):
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.1)
        manager.interrupt_kernel()  # SIGINT to the kernel's process group, as Jupyter does
        interrupted = cell_messages(client, msg_id, timeout=120)
        assert _errors(interrupted) == ["KeyboardInterrupt"], _text(interrupted)

        after = run_cell(client, f"print('world', {LAUNCH.format('world')})", timeout=240)
        assert not _errors(after), _text(after)
        assert "world 2" in _text(after)
        assert len(_running(cluster)) == len(cluster)  # no worker was lost or replaced

        os.kill(manager.provisioner.process.pid, signal.SIGKILL)  # the cluster ends with it
        deadline = time.monotonic() + END_BOUND_S
        while _running(cluster) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(cluster), "the cluster outlived its kernel"


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
