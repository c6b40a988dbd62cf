"""The default ``%%distributed`` pool on a Dask cluster, in a real kernel, after its nodes close.

A fault closes a cluster pool's nodes: code an interrupt cannot reach (a long ``time.sleep``
in C), a Dask worker that dies. The default pool then starts new nodes at its next cell, as
the local default pool starts new workers, and ``%distributed restart`` works on it. The
kernel is interrupted as Jupyter does it (``manager.interrupt_kernel()``: SIGINT to the
kernel's process group); ``local_cluster()`` keeps the Dask workers out of that group, so only
the pool's nodes are at stake.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from notebook_kit.launch.cluster.pool import CLOSED
from tests.kernel_cells import cell_messages, real_kernel, run_cell
from tests.optional import needs

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    needs("distributed", what="a pool on a local Dask cluster"),
]

SETUP = """\
%load_ext notebook_kit
import os, signal
from notebook_kit import local_cluster
cluster = local_cluster(n_workers=2, threads_per_worker=1)
client = cluster.get_client()
client.wait_for_workers(2)"""
FIRST = "%%distributed --cluster client --num-nodes 2 -n 1\nimport time\nkept = 'yes'\nkept"
SLEEP = """\
%%distributed
import torch.distributed as dist
open({marker!r} + str(dist.get_rank()), "w").close()
time.sleep(120)"""
# One of the pool's Dask workers dies (its nanny starts another): the one its ranks run under.
KILL = """\
pool = %distributed
above = {parent.pid for pid in pool.pids for parent in psutil.Process(pid).parents()}
gone = next(address for address, pid in client.run(os.getpid).items() if pid in above)
os.kill(client.run(os.getpid)[gone], signal.SIGKILL)"""
# The scheduler has let the dead worker go, and the nanny's new one has joined.
REPLACED = """\
deadline = time.monotonic() + 120
while gone in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.workers)):
    assert time.monotonic() < deadline, "the scheduler still lists the killed worker"
    time.sleep(0.1)
client.wait_for_workers(2, timeout=120)"""
WORLD = "import torch.distributed as dist\ndist.get_world_size()"
REVIVED = "Starting new workers for the default pool, which was closed"


def _text(messages: list[dict[str, Any]]) -> str:
    parts = []
    for message in messages:
        content = message["content"]
        if message["msg_type"] == "stream":
            parts.append(content["text"])
        elif message["msg_type"] == "execute_result":
            parts.append(content["data"]["text/plain"])
        elif message["msg_type"] == "error":
            parts.append(f"{content['ename']}: {content['evalue']}")
    return "\n".join(parts)


def _errors(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"]["ename"] for m in messages if m["msg_type"] == "error"]


def _ok(client: Any, code: str) -> str:
    """Run ``code``; its output and value, after checking that it raised nothing."""
    messages = run_cell(client, code, timeout=240)
    assert not _errors(messages), _text(messages)
    return _text(messages)


@pytest.mark.timeout(600)
def test_the_default_cluster_pool_starts_new_nodes_after_an_interrupt_or_a_lost_worker(
    tmp_path: Path,
) -> None:
    with real_kernel() as (manager, client):
        _ok(client, SETUP + "\nimport psutil, time")
        assert "'yes'" in _ok(client, FIRST)

        # An interrupt while every rank sleeps in C: the nodes are closed.
        marker = str(tmp_path / "asleep-")
        msg_id = client.execute(SLEEP.format(marker=marker))
        deadline = time.monotonic() + 120
        while not all(Path(f"{marker}{rank}").exists() for rank in (0, 1)):
            assert time.monotonic() < deadline, "the ranks never started the cell"
            time.sleep(0.1)
        manager.interrupt_kernel()  # SIGINT to the kernel's process group, as Jupyter does
        interrupted = cell_messages(client, msg_id, timeout=120)
        assert _errors(interrupted) == ["KeyboardInterrupt"], _text(interrupted)
        assert CLOSED in _text(interrupted)
        # %distributed restart starts new nodes for the closed pool.
        assert REVIVED in _ok(client, "%distributed restart")
        assert _ok(client, "%%distributed\n'kept' in globals()").rstrip().endswith("False")

        # A Dask worker under the pool dies between cells (its nanny starts another): the next
        # cell starts new nodes, as the local default pool starts new workers.
        _ok(client, KILL)
        _ok(client, REPLACED)
        after = _ok(client, f"%%distributed\n{WORLD}")
        assert REVIVED in after and after.rstrip().endswith("2"), after
        # --cluster without --num-nodes keeps the pool and its nodes, as no -n keeps its size.
        world = _ok(client, f"%%distributed --cluster client\n{WORLD}")
        assert world.rstrip().endswith("2") and "Started" not in world, world
