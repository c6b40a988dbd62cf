"""What one launch resolved its settings to: the LaunchPlan the kernel and every worker read."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from notebook_kit.config.arguments import is_loopback
from notebook_kit.config.environment import KernelState, usable_cpu_count
from notebook_kit.config.mesh_layout import MESH_ORDER, MeshLayout
from notebook_kit.config.schema import CALL_SETTINGS, scoped

if TYPE_CHECKING:
    from notebook_kit.config.launch_config import LaunchConfig

__all__ = [
    "DEFAULT_RENDEZVOUS_TIMEOUT",
    "DEFAULT_STALL_SECONDS",
    "LOOPBACK",
    "LaunchPlan",
    "auto_process_count",
    "auto_threads",
    "worker_environment",
]

LOOPBACK = "127.0.0.1"
DEFAULT_RENDEZVOUS_TIMEOUT: float = CALL_SETTINGS["rendezvous_timeout"].default
DEFAULT_STALL_SECONDS: float = CALL_SETTINGS["stall_seconds"].default


def auto_process_count(gpus: int) -> int:
    """``num_processes`` left to the machine: one per GPU, else one (the notebook and the CLI)."""
    return max(gpus, 1)


def auto_threads(num_processes: int) -> int:
    """``threads_per_process`` left to the machine: the usable cores shared out, at least one."""
    return max(1, usable_cpu_count() // num_processes)


@dataclass(frozen=True)
class LaunchPlan:
    """The validated, resolved shape of one launch on this node."""

    num_processes: int
    num_nodes: int
    node_rank: int
    master_addr: str
    port: int | None
    backend: str
    threads: int
    mixed_precision: str
    gradient_accumulation_steps: int
    rendezvous_timeout: float
    timeout: float | None
    max_restarts: int = 0
    use_fsdp: bool = False  # every worker's Accelerator shards with FSDP2 by default
    # The ParallelismConfig sizes every worker's Accelerator uses when given none; all 1: none.
    parallelism_config_dp_replicate_size: int = 1
    parallelism_config_dp_shard_size: int = 1
    parallelism_config_tp_size: int = 1
    parallelism_config_cp_size: int = 1
    seed: int | None = None
    live: bool | None = None
    device: str = "cpu"  # "cuda" (each process on its own GPU) or "cpu"
    isolate: bool = False  # one process runs in a forked worker, not in the caller
    cpu_reason: str | None = None  # why GPUs are visible but the run stays on the CPU
    kernel: KernelState | None = field(default=None, compare=False)  # the fork probe, if run
    cores: int = field(default=0, compare=False)  # usable CPU cores here (0: not known)
    stall_seconds: float | None = DEFAULT_STALL_SECONDS  # None: never show where ranks wait
    storage_timeout: int = 60  # seconds a checkpoint save waits on silent storage
    memory_history: bool = False  # each GPU rank records its allocations, for an OOM's snapshot
    post_mortem: bool = False  # a rank that raises opens pdb in its frame before it reports
    # Seconds a collective waits for the other ranks; None: torch's default (30 min for gloo).
    collective_timeout: float | None = None
    # "auto", "fork" or "template": how the kernel starts the workers (launch/template_choice.py)
    start_method: str = "auto"

    @property
    def parallelism(self) -> dict[str, int]:
        """The mesh sizes by dimension when any is above 1 (Accelerate's names), else {}."""
        sizes = {dim: getattr(self, f"parallelism_config_{dim}_size") for dim in MESH_ORDER}
        return sizes if any(size > 1 for size in sizes.values()) else {}

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_nodes

    @property
    def in_process(self) -> bool:
        """One process on one node runs in the caller, without forking (unless isolated)."""
        return self.num_processes == 1 and self.num_nodes == 1 and not self.isolate

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.num_processes + local_rank

    def banner(self) -> str:
        """One line saying where the run goes, and why it is on the CPU when GPUs are there.

        Example:
            >>> LaunchPlan(2, 1, 0, LOOPBACK, None, "gloo", 1, "no", 1, 300.0, None).banner()
            'Launching 2 processes on CPU (gloo), 1 thread each'
        """
        if self.in_process:
            text = f"Running 1 process in this kernel on {self._where(0)}"
            text += "" if self.device == "cuda" else " (world size 1, gloo)"
        else:
            noun = "process" if self.num_processes == 1 else "processes"
            where = "CPU" if self.device == "cpu" else self._gpus()
            text = f"Launching {self.num_processes} {noun} on {where} ({self.backend})"
            if self.num_nodes > 1:
                text += f", node {self.node_rank} of {self.num_nodes}, world size {self.world_size}"
                if is_loopback(self.master_addr):
                    text += (
                        f", every node on this machine (master_addr {self.master_addr} is loopback)"
                    )
            threads = "thread" if self.threads == 1 else "threads"
            text += f", {self.threads} {threads} each"
        mesh = MeshLayout.of(self.parallelism).describe() if self.parallelism else None
        notes = [text, mesh, self.cpu_reason, self._oversubscribed()]
        return ". ".join(note for note in notes if note)

    def _oversubscribed(self) -> str | None:
        """A warning when the processes outnumber the cores they run on."""
        if not self.cores or self.num_processes <= self.cores:
            return None
        cores = "core" if self.cores == 1 else "cores"
        return (
            f"Warning: {self.num_processes} processes share {self.cores} CPU {cores}, so "
            f"they take turns and each runs slower; num_processes={self.cores} avoids that"
        )

    def _where(self, index: int) -> str:
        if self.device == "cpu":
            return "CPU"
        names = self.kernel.gpu_names if self.kernel else ()
        return f"cuda:{index} ({names[index]})" if index < len(names) else f"cuda:{index}"

    def _gpus(self) -> str:
        if self.num_processes == 1:
            return self._where(0)
        names = set(self.kernel.gpu_names[: self.num_processes]) if self.kernel else set()
        return f"{self.num_processes} GPUs" + (f" ({names.pop()})" if len(names) == 1 else "")


def worker_environment(plan: LaunchPlan | LaunchConfig, threads: int) -> dict[str, str]:
    """The variables every worker starts with, forked here or by ``notebook-kit launch``: its
    threads, each "worker" setting as the ``NOTEBOOK_KIT_<NAME>`` its Accelerator reads, and on
    one Linux node gloo and NCCL kept on loopback unless chosen (gloo otherwise probes every
    interface, and NCCL's bootstrap may pick one that hangs, such as docker0).

    Example:
        >>> from notebook_kit.config.launch_config import LaunchConfig
        >>> worker_environment(LaunchConfig(use_fsdp=True), 2)["NOTEBOOK_KIT_USE_FSDP"]
        'yes'
    """
    environment = {"OMP_NUM_THREADS": str(threads)}
    for name, setting in scoped("worker").items():
        value = getattr(plan, name)
        environment[setting.env_var] = (
            ("yes" if value else "no") if setting.kind == "bool" else str(value)
        )
    if plan.num_nodes == 1 and sys.platform.startswith("linux"):
        for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            environment[variable] = os.environ.get(variable, "lo")
    return environment
