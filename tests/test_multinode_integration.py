"""Two launcher processes on one machine form one multi-node job over loopback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from tests.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]

NODE_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from notebook_kit import notebook_launcher

    def train():
        total = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(total)
        torch.manual_seed(dist.get_rank())  # different data on every rank
        model = DistributedDataParallel(torch.nn.Linear(4, 1))
        model(torch.randn(8, 4)).sum().backward()
        grads = [torch.zeros(4) for _ in range(dist.get_world_size())]
        dist.all_gather(grads, model.module.weight.grad.flatten())
        in_sync = all(torch.equal(grads[0], grad) for grad in grads)
        return dist.get_world_size(), int(total.item()), os.environ["RANK"], in_sync

    node_rank, port, wait = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    result = notebook_launcher(
        train, num_processes=2, num_nodes=2, node_rank=node_rank,
        master_addr="127.0.0.1", use_port=port, rendezvous_timeout=wait,
    )
    print("RESULT", result)
    """
)


def _start_node(script, node_rank: int, port: int, wait: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(script), str(node_rank), str(port), str(wait)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_two_nodes_form_one_world_of_four(tmp_path):
    script = tmp_path / "node.py"
    script.write_text(NODE_SCRIPT)
    port = free_port()
    nodes = [_start_node(script, rank, port, 60) for rank in (1, 0)]  # node 1 arrives first
    outputs = [node.communicate(timeout=120)[0] for node in nodes]
    assert all(node.returncode == 0 for node in nodes), outputs
    node1, node0 = outputs
    assert "node 0 of 2, world size 4" in node0
    assert "RESULT (4, 6, '0', True)" in node0  # 0+1+2+3, DDP gradients equal on all ranks
    assert "RESULT (4, 6, '2', True)" in node1  # node 1 returns its local rank 0, global rank 2


def test_a_node_that_never_arrives_gives_a_rendezvous_error(tmp_path):
    script = tmp_path / "node.py"
    script.write_text(NODE_SCRIPT)
    started = time.monotonic()
    node0 = _start_node(script, 0, free_port(), 3)
    output = node0.communicate(timeout=60)[0]
    assert node0.returncode != 0
    assert time.monotonic() - started < 30
    assert "WorkerError" in output and "Only 2 of 4 processes joined the rendezvous" in output
