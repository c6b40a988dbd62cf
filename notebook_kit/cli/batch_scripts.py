"""Batch scripts that run an exported notebook on several machines: Coiled Batch and SLURM.

``notebook-kit export NOTEBOOK --coiled-batch`` (or ``--slurm``) writes, beside the script,
a shell script that asks the scheduler for the nodes and starts ``notebook-kit launch`` once
per node. The launcher takes its node's place from the scheduler's variables
(:mod:`notebook_kit.config.placement`): Coiled Batch's ``COILED_BATCH_TASK_ID``,
``COILED_BATCH_TASK_COUNT`` and ``COILED_BATCH_SCHEDULER_ADDRESS`` (task 0 runs on the
scheduler's VM, so that address is node 0's), or SLURM's ``SLURM_NODEID``, ``SLURM_NNODES``
and the job's node list; nothing in the script names a rank or a host.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from notebook_kit.config.placement import DEFAULT_MASTER_PORT

__all__ = ["BATCH_KINDS", "BatchRequest", "write_batch_script"]

# The kind of batch script -> the file name it gets beside the exported script.
BATCH_KINDS = {"coiled": ".sh", "slurm": ".sbatch"}


@dataclass(frozen=True)
class BatchRequest:
    """What the batch script asks for: nodes, processes (and GPUs) on each, the port."""

    nodes: int = 2
    num_processes: int = 1
    gpus: bool = False
    master_port: int = DEFAULT_MASTER_PORT

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"--nodes must be 1 or more, got {self.nodes}")
        if self.num_processes < 1:
            raise ValueError(f"--num-processes must be 1 or more, got {self.num_processes}")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"--master-port must be a TCP port (1-65535), got {self.master_port}")


def _launch_line(script: Path, request: BatchRequest) -> str:
    return (
        f"notebook-kit launch --num-processes {request.num_processes} "
        f'--master-port {request.master_port} {shlex.quote(script.name)} "$@"'
    )


def coiled_batch_script(script: Path, request: BatchRequest) -> str:
    """``coiled batch run train.sh``: one task per VM, task 0 on the scheduler's VM."""
    lines = [
        "#!/bin/bash",
        f"# Runs {script.name} on {request.nodes} VMs: coiled batch run {script.stem}.sh",
        f"# COILED ntasks {request.nodes}",
        "# COILED task-on-scheduler true",
    ]
    if request.gpus:
        lines.append("# COILED gpu true")
    lines += [
        "",
        "# Coiled numbers the tasks: COILED_BATCH_TASK_ID is this node's rank,",
        "# COILED_BATCH_TASK_COUNT the number of nodes and COILED_BATCH_SCHEDULER_ADDRESS node 0's",
        "# address. notebook-kit launch reads them; it starts this node's processes.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        f"exec {_launch_line(script, request)}",
    ]
    return "\n".join(lines) + "\n"


def slurm_batch_script(script: Path, request: BatchRequest) -> str:
    """``sbatch train.sbatch``: one task per node, each running ``notebook-kit launch``."""
    lines = [
        "#!/bin/bash",
        f"# Runs {script.name} on {request.nodes} nodes: sbatch {script.stem}.sbatch",
        f"#SBATCH --job-name={script.stem}",
        f"#SBATCH --nodes={request.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if request.gpus:
        lines.append(f"#SBATCH --gpus-per-node={request.num_processes}")
    lines += [
        "",
        "# srun starts one task per node; SLURM_NODEID is its node rank and the first host of the",
        "# job's node list node 0's address. notebook-kit launch starts the node's processes.",
        "set -euo pipefail",
        f"srun {_launch_line(script, request)}",
    ]
    return "\n".join(lines) + "\n"


def write_batch_script(kind: str, script: Path, request: BatchRequest) -> Path:
    """Write the ``kind`` batch script beside ``script`` (executable) and return its path."""
    if kind not in BATCH_KINDS:
        raise ValueError(f"unknown batch script kind {kind!r}; one of {sorted(BATCH_KINDS)}")
    write = coiled_batch_script if kind == "coiled" else slurm_batch_script
    target = script.with_suffix(BATCH_KINDS[kind])
    target.write_text(write(script, request), encoding="utf-8")
    target.chmod(0o755)
    return target
