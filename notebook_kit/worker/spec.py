"""What the kernel tells each worker before forking it: its place in the launch and its pipes."""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.connection import Connection

from notebook_kit.config.launch_plan import LaunchPlan

__all__ = ["WorkerPipes", "WorkerSpec"]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one worker needs to know, decided by the kernel before forking."""

    plan: LaunchPlan  # what every worker of the launch shares
    local_rank: int
    master_port: int
    listen_fd: int | None  # set for the rank that serves the store on the kernel's socket
    home_model_ids: frozenset[int]
    restart_count: int
    # Every store key of the launch lives under it; on one node a secret that only the forked
    # workers know (never put in the environment, which other processes can read).
    store_prefix: str = "notebook_kit/"
    # The kernel's weights file (inherited at the fork): rank 0 writes the trained weights
    # there instead of into its message. None: they travel in the message.
    weights_fd: int | None = None

    @property
    def rank(self) -> int:
        return self.plan.global_rank(self.local_rank)


@dataclass(frozen=True)
class WorkerPipes:
    """The write ends a worker talks through, and the kernel's descriptors it must close."""

    stdout_fd: int
    stderr_fd: int
    messages: Connection
    inherited_fds: tuple[int, ...]  # descriptors of the guardian and other workers: closed
    answers: Connection | None = None  # read end: the lines typed at this rank's pdb prompt
