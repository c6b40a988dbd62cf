"""Scheduler variables -> node placement and torch's rank variables (plain dicts, no scheduler)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from notebook_kit.config.placement import (
    PlacementError,
    detect_node,
    first_host,
    slurm_process_environment,
)
from tests.processes import clean_environment, free_port


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("gpu[01-04],cpu7", "gpu01"),
        ("node7", "node7"),
        ("a1,a2", "a1"),
        ("n[3,5-9]", "n3"),
        ("rack[2-3]-n[08,10]", "rack2-n08"),
        ("x[007]", "x007"),
    ],
)
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("nodelist", ["", "n[1", "n]", "[]x", "n[[1]]"])
def test_malformed_node_lists_are_named(nodelist):
    with pytest.raises(PlacementError, match="SLURM node list"):
        first_host(nodelist)


def test_no_scheduler_and_single_node_jobs_give_no_placement():
    assert detect_node({}) is None
    assert (
        detect_node({"SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "a"}) is None
    )


def test_slurm_one_task_per_node():
    env = {
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_NODEID": "2",
        "SLURM_NTASKS": "4",
        "SLURM_JOB_NODELIST": "gpu[01-04]",
    }
    placement = detect_node(env)
    assert (placement.source, placement.num_nodes, placement.node_rank) == ("slurm", 4, 2)
    assert placement.master_addr == "gpu01" and placement.master_port is None
    assert placement.describe() == "node 2 of 4 from SLURM, node 0 at gpu01"


def test_slurm_with_several_tasks_per_node_is_refused():
    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_NTASKS": "8", "SLURM_NODELIST": "a,b"}
    with pytest.raises(PlacementError, match="ntasks-per-node=1"):
        detect_node(env)


def test_coiled_batch():
    env = {
        "COILED_BATCH_TASK_ID": "1",
        "COILED_BATCH_TASK_COUNT": "3",
        "COILED_BATCH_SCHEDULER_ADDRESS": "10.1.2.3",
    }
    placement = detect_node(env)
    assert (placement.source, placement.num_nodes, placement.node_rank) == ("coiled", 3, 1)
    assert placement.master_addr == "10.1.2.3"
    with pytest.raises(PlacementError, match="COILED_BATCH_SCHEDULER_ADDRESS"):
        detect_node({**env, "COILED_BATCH_SCHEDULER_ADDRESS": ""})
    with pytest.raises(PlacementError, match="rank 3 of only 3"):
        detect_node({**env, "COILED_BATCH_TASK_ID": "3"})
    with pytest.raises(PlacementError, match="COILED_BATCH_TASK_COUNT='two' is not an integer"):
        detect_node({**env, "COILED_BATCH_TASK_COUNT": "two"})


def test_torchrun_pet_variables_win_over_slurm():
    env = {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "head",
        "PET_MASTER_PORT": "1234",
        "PET_NPROC_PER_NODE": "8",
        "SLURM_NNODES": "5",
        "SLURM_NODEID": "4",
        "SLURM_JOB_NODELIST": "x[1-5]",
    }
    placement = detect_node(env)
    assert placement.source == "torchrun"
    assert (placement.num_nodes, placement.node_rank, placement.master_addr) == (2, 1, "head")
    assert (placement.master_port, placement.num_processes) == (1234, 8)
    with pytest.raises(PlacementError, match="elastic range"):
        detect_node({"PET_NNODES": "1:4"})


SRUN_TASK = {
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_JOB_NODELIST": "gpu[11-14]",
}


def test_srun_task_becomes_torch_rank_variables():
    assert slurm_process_environment(SRUN_TASK) == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu11",
        "MASTER_PORT": "29500",
    }
    given = slurm_process_environment({**SRUN_TASK, "MASTER_PORT": "4000", "MASTER_ADDR": "h"})
    assert (given["MASTER_ADDR"], given["MASTER_PORT"]) == ("h", "4000")


@pytest.mark.parametrize(
    "change",
    [
        {"RANK": "0"},  # torchrun or notebook-kit launch already set torch's variables
        {"SLURM_STEP_ID": None},  # the batch script itself, not an srun task
        {"SLURM_NTASKS": "1"},  # a single task needs no process group
    ],
)
def test_srun_variables_are_left_alone_outside_a_multi_task_step(change):
    env = {**SRUN_TASK, **{k: v for k, v in change.items() if v is not None}}
    for name in [k for k, v in change.items() if v is None]:
        env.pop(name)
    assert slurm_process_environment(env) == {}


SRUN_SCRIPT = """
import torch, torch.distributed as dist
from notebook_kit import Accelerator
accelerator = Accelerator()
total = torch.tensor([float(accelerator.process_index + 1)])
dist.all_reduce(total)
print(accelerator.process_index, accelerator.num_processes, accelerator.local_process_index,
      total.item())
"""


@pytest.mark.integration
@pytest.mark.usefixtures("no_leftover_processes")
def test_accelerator_in_processes_started_like_srun_tasks(tmp_path):
    port = str(free_port())
    tasks = []
    for task in ("0", "1"):
        env = clean_environment(
            tmp_path,
            SLURM_STEP_ID="0",
            SLURM_PROCID=task,
            SLURM_NTASKS="2",
            SLURM_LOCALID=task,
            SLURM_JOB_NODELIST="127.0.0.1",
            MASTER_PORT=port,
            GLOO_SOCKET_IFNAME="lo",
        )
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
            env.pop(name, None)
        command = [sys.executable, "-c", SRUN_SCRIPT]
        tasks.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
    outputs = [task.communicate(timeout=90)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0]
    assert outputs == ["0 2 0 3.0\n", "1 2 1 3.0\n"]
