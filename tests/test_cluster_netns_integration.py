"""A cluster run across two "hosts" (Linux network namespaces on a bridge, no route out).

The scheduler and the kernel side run in host 0, one Dask worker in each of hosts 1 and 2.
The ranks must meet on the hosts' own 198.18.0.x addresses over the right interface, and
cutting host 2's link mid-run must end the run with "node 1 lost", without a hang and with
nothing left on either host. Skipped with the reason where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from notebook_kit.launch.cluster.attempt import NODE_SILENCE_SECONDS
from notebook_kit.node.protocol import LEASE_SECONDS
from tests.netns import hosts
from tests.optional import needs

pytestmark = [pytest.mark.integration, pytest.mark.slow, needs("distributed", what="cluster runs")]

DASK = str(Path(sys.executable).with_name("dask"))
LINK_DOWN_BOUND_S = NODE_SILENCE_SECONDS + 15.0  # silence noticed, then every node asked to end

_KERNEL = r"""
import json, os, socket, sys, time
import torch, torch.distributed as dist
from distributed import Client
from notebook_kit import notebook_launcher
from notebook_kit.errors import WorkerError

scheduler, markers = sys.argv[1], sys.argv[2]

def where():
    seen = [None] * dist.get_world_size()
    mine = {"ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "master": os.environ["MASTER_ADDR"],
            "resolves_to": socket.gethostbyname(socket.gethostname())}
    dist.all_gather_object(seen, mine)
    return seen

def forever(markers):
    open(os.path.join(markers, f"rank{dist.get_rank()}"), "w").close()
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.05)

client = Client(scheduler)
client.wait_for_workers(2, timeout=120)
print("WHERE " + json.dumps(notebook_launcher(where, num_processes=1, cluster=client, live=False)),
      flush=True)
try:
    notebook_launcher(forever, args=(markers,), num_processes=1, cluster=client, live=False)
except WorkerError as error:
    print("ERROR " + json.dumps({"text": str(error), "at": time.time()}), flush=True)
"""


def _name_of(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:  # ended meanwhile
        return ""


def _below(pid: int) -> list[int]:
    """What runs below a Dask worker (not its zygote, kept for the next run)."""
    try:
        below = psutil.Process(pid).children(recursive=True)
        return [p.pid for p in below if _name_of(p) != "nk-zygote"]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.timeout(600)
def test_two_hosts_meet_on_their_own_interface_and_a_cut_link_is_node_lost(tmp_path):
    with hosts(3) as net:
        scheduler = f"tcp://{net.address(0)}:8786"
        logs = (tmp_path / "dask.log").open("w")
        net.start(
            0,
            [DASK, "scheduler", "--host", net.address(0), "--port", "8786", "--no-dashboard"],
            stdout=logs,
            stderr=logs,
        )
        workers = [
            net.start(
                host,
                [
                    DASK,
                    "worker",
                    scheduler,
                    "--host",
                    net.address(host),
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--no-dashboard",
                ],
                stdout=logs,
                stderr=logs,
            )
            for host in (1, 2)
        ]
        kernel = net.start(
            0,
            [sys.executable, "-c", _KERNEL, scheduler, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())},
        )
        where = json.loads(kernel.stdout.readline().removeprefix("WHERE "))
        assert [rank["ifname"] for rank in where] == [net.interface(1), net.interface(2)]
        assert {rank["master"] for rank in where} == {net.address(1)}  # node 0's own address
        deadline = time.monotonic() + 180
        while not all((tmp_path / f"rank{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline and kernel.poll() is None
            time.sleep(0.05)
        cut = time.time()
        net.link_down(2)
        line = kernel.stdout.readline()
        while line and not line.startswith("ERROR "):
            # The cell's word on the failed rank while the other node is ended, before the error.
            assert "Rank 1 (node 1) failed (node 1 lost" in line, line
            line = kernel.stdout.readline()
        assert line.startswith("ERROR "), line
        error = json.loads(line.removeprefix("ERROR "))
        assert "node 1 lost" in error["text"]
        assert error["at"] - cut < LINK_DOWN_BOUND_S
        deadline = time.monotonic() + LEASE_SECONDS + 20
        while any(_below(worker.pid) for worker in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [_below(worker.pid) for worker in workers if _below(worker.pid)]
        kernel.wait(timeout=60)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(name not in names for name in net.names), names
