"""A script that calls notebook_launcher runs unchanged under torchrun."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]

SCRIPT = textwrap.dedent(
    """
    import os
    import torch, torch.distributed as dist
    from notebook_kit import notebook_launcher

    def train(scale):
        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
        return total.item() * scale, os.getpid()

    if __name__ == "__main__":
        value, pid = notebook_launcher(train, args=(10,), num_processes=2)
        print(f"rank {os.environ['RANK']} got {value} in-process={pid == os.getpid()}")
    """
)


def test_launch_under_torchrun_uses_torchruns_processes(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "rank 0 got 30.0 in-process=True" in done.stdout
    assert "rank 1 got 30.0 in-process=True" in done.stdout
    assert "Running under torchrun as rank 0 of 2" in done.stdout
