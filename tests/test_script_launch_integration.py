"""``notebook-kit launch`` with real torchrun workers: environment, two nodes, failures."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.processes import CLI, clean_environment, free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch, torch.distributed as dist
    from notebook_kit import Accelerator

    accelerator = Accelerator()
    total = torch.tensor([float(accelerator.process_index + 1)])
    dist.all_reduce(total)
    print(
        f"rank {accelerator.process_index} of {accelerator.num_processes} "
        f"(local {accelerator.local_process_index}): sum {total.item():g}, "
        f"{accelerator.mixed_precision}, accumulate {accelerator.gradient_accumulation_steps}, "
        f"{torch.get_num_threads()} thread(s), args {sys.argv[1:]}",
        flush=True,
    )
    if "--fail" in sys.argv and accelerator.process_index == 1:
        raise ValueError("rank 1 gives up")
    dist.barrier()
    """
)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    return path


def test_script_runs_with_the_notebook_launch_environment(tmp_path, script):
    options = ["--num-processes", "2", "--mixed-precision", "bf16"]
    options += ["--gradient-accumulation-steps", "4", "--threads-per-process", "1"]
    command = [*CLI, *options, str(script), "--lr", "0.5"]
    done = subprocess.run(
        command, env=clean_environment(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "notebook-kit launch: 2 processes of" in done.stdout
    for rank in (0, 1):
        expected = (
            f"rank {rank} of 2 (local {rank}): sum 3, bf16, accumulate 4, 1 thread(s), "
            "args ['--lr', '0.5']"
        )
        assert expected in done.stdout


def test_two_nodes_from_coiled_batch_variables_on_loopback(tmp_path, script):
    port = str(free_port())
    nodes = []
    for task in ("0", "1"):
        env = clean_environment(
            tmp_path,
            COILED_BATCH_TASK_ID=task,
            COILED_BATCH_TASK_COUNT="2",
            COILED_BATCH_SCHEDULER_ADDRESS="127.0.0.1",
        )
        command = [*CLI, "--num-processes", "1", "--master-port", port, str(script)]
        nodes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
    outputs = [node.communicate(timeout=120)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0]
    assert "node 0 of 2 from Coiled, node 0 at 127.0.0.1" in outputs[0]
    assert "rank 0 of 2 (local 0): sum 3" in outputs[0]
    assert "rank 1 of 2 (local 0): sum 3" in outputs[1]


def test_a_failing_rank_is_reported_once_with_the_fix(tmp_path, script):
    command = [*CLI, "--num-processes", "2", str(script), "--fail"]
    done = subprocess.run(
        command, env=clean_environment(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "ValueError: rank 1 gives up" in done.stderr
    assert "notebook-kit launch: rank 1 of 2 (pid " in done.stderr
    assert "Pass --max-restarts K to restart the workers" in done.stderr
