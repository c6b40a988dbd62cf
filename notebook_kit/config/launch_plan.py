"""What one launch resolved its settings to: the LaunchPlan the kernel and every worker read."""

from __future__ import annotations

from dataclasses import dataclass, field

from notebook_kit.config.arguments import is_loopback
from notebook_kit.config.environment import KernelState

__all__ = ["DEFAULT_RENDEZVOUS_TIMEOUT", "LOOPBACK", "LaunchPlan"]

LOOPBACK = "127.0.0.1"
DEFAULT_RENDEZVOUS_TIMEOUT = 300.0  # seconds for the other nodes to join


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
    seed: int | None = None
    live: bool | None = None
    kernel: KernelState | None = field(default=None, compare=False)  # the fork probe, if run

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_nodes

    @property
    def in_process(self) -> bool:
        """One process on one node runs in the caller, without forking."""
        return self.num_processes == 1 and self.num_nodes == 1

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.num_processes + local_rank

    def banner(self) -> str:
        if self.in_process:
            return "Running 1 process in this kernel (world size 1, gloo)"
        where = "CPU" if self.backend == "gloo" else f"{self.num_processes} GPUs"
        noun = "process" if self.num_processes == 1 else "processes"
        text = f"Launching {self.num_processes} {noun} on {where} ({self.backend})"
        if self.num_nodes > 1:
            text += f", node {self.node_rank} of {self.num_nodes}, world size {self.world_size}"
            if is_loopback(self.master_addr):
                text += f", every node on this machine (master_addr {self.master_addr} is loopback)"
        threads = "thread" if self.threads == 1 else "threads"
        return f"{text}, {self.threads} {threads} each"
