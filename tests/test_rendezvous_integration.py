"""The rendezvous: other local processes cannot disturb a launch, and every wait is bounded."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist

from notebook_kit import WorkerError, notebook_launcher
from tests.processes import free_port
from tests.test_multinode_integration import NODE_SCRIPT

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]

# Another local user's process: connects to the launch's store and forges every key it could
# know from the source (all but a per-launch secret), at the moment that does the most harm:
# after rank 0 finished, before rank 1 did.
FORGER = textwrap.dedent(
    """
    import sys, time
    from datetime import timedelta
    import torch.distributed as dist

    port_file, forged_file, rank0_done = sys.argv[1:4]
    while not open(port_file).read().strip():
        time.sleep(0.01)
    store = dist.TCPStore("127.0.0.1", int(open(port_file).read()), is_master=False,
                          timeout=timedelta(seconds=10))
    while not open(rank0_done).read():
        time.sleep(0.01)
    time.sleep(0.2)  # rank 0 is now waiting for the others to finish
    store.add("notebook_kit/finished", 1)
    for prefix in ("notebook_kit/", "notebook_kit", ""):
        forged = dist.PrefixStore(prefix, store) if prefix else store
        for step in ("joined", "ready", "finished"):
            for rank in range(2):
                forged.set(f"{step}/{rank}", "1")
            forged.set(f"notebook_kit/all_{step}", "1")
    open(forged_file, "w").write("done")
    """
)


def test_another_local_process_cannot_disturb_a_launch(tmp_path):
    port_file, forged, rank0_done = tmp_path / "port", tmp_path / "forged", tmp_path / "rank0"
    port_file.write_text("")
    rank0_done.write_text("")
    command = [sys.executable, "-c", FORGER, str(port_file), str(forged), str(rank0_done)]
    forger = subprocess.Popen(command, stderr=subprocess.PIPE)

    def train():
        if dist.get_rank() == 0:
            port_file.write_text(os.environ["MASTER_PORT"])
            rank0_done.write_text("returning")
            return "rank 0 done"
        while not forged.exists():  # rank 1 finishes only after the forgery
            time.sleep(0.01)
        time.sleep(1.0)  # had the forgery worked, rank 0 and its store would be gone by now
        dist.distributed_c10d._get_default_store().add("rank 1 still uses the store", 1)
        return "rank 1 done"

    started = time.monotonic()
    try:
        assert notebook_launcher(train, num_processes=2, timeout=30) == "rank 0 done"
    finally:
        forger.wait(timeout=30)
    assert forger.returncode == 0, forger.stderr.read()
    assert time.monotonic() - started < 15


def test_the_store_host_waits_for_late_ranks_only_rendezvous_timeout():
    def rank_one_lingers():
        if dist.get_rank() == 1:
            time.sleep(30)

    started = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        notebook_launcher(rank_one_lingers, num_processes=2, rendezvous_timeout=2, timeout=60)
    assert time.monotonic() - started < 15
    message = str(caught.value)
    assert "ranks 1 did not finish within rendezvous_timeout=2 s" in message
    assert "wait_for_everyone" in message


def test_multi_node_store_listens_on_master_addr_only(tmp_path):
    script = tmp_path / "node.py"
    script.write_text(NODE_SCRIPT)
    port = free_port()
    node0 = subprocess.Popen(
        [sys.executable, str(script), "0", str(port), "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        addresses = _listening_on(node0.pid, port, wait=30)
    finally:
        node0.communicate(timeout=60)
    assert addresses == {"127.0.0.1"}


def test_master_addr_that_is_not_this_machine_fails_before_forking(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(OSError, match=r"master_addr='192\.0\.2\.1' is not an address of this"):
        notebook_launcher(
            marker.touch,
            num_processes=2,
            num_nodes=2,
            node_rank=0,
            master_addr="192.0.2.1",  # TEST-NET-1: never a local address
            use_port=free_port(),
        )
    assert not marker.exists()


def _listening_on(pid: int, port: int, wait: float) -> set[str]:
    """Addresses on which ``pid`` or a process below it listens on ``port``."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        found = set()
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for process in tree:
            try:
                connections = process.net_connections(kind="tcp")
            except psutil.Error:
                continue
            found |= {
                c.laddr.ip
                for c in connections
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port
            }
        if found:
            return found
        time.sleep(0.05)
    return set()


def _launch_secrets() -> dict[str, object]:
    """Rank 0 reads the store's keys through a plain client and names their launch prefix."""
    if dist.get_rank() != 0:
        return {}
    client = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )
    prefixes = {key.split("/")[1] for key in client.list_keys() if key.startswith("notebook_kit/")}
    seen = " ".join([*os.environ.values(), Path("/proc/self/cmdline").read_text()])
    return {"prefixes": prefixes, "in_environment_or_argv": any(p in seen for p in prefixes)}


def test_the_one_node_store_prefix_is_random_and_new_at_every_launch():
    first = notebook_launcher(_launch_secrets, num_processes=2, live=False)
    second = notebook_launcher(_launch_secrets, num_processes=2, live=False)
    (one,), (two,) = first["prefixes"], second["prefixes"]
    for prefix in (one, two):
        assert re.fullmatch(r"[0-9a-f]{32}", prefix), prefix  # 128 random bits
    assert one != two
    assert not first["in_environment_or_argv"] and not second["in_environment_or_argv"]
