"""The messages of a cluster run, between the kernel, each node task and its node process.

Names on the scheduler (event topic, variables) all derive from the run's random id, so two
runs, or two kernels sharing a cluster, never read each other's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ADDRESS",
    "CONTROL_PERIOD_SECONDS",
    "EVENT",
    "LEASE_SECONDS",
    "OUTCOME",
    "NodeOrder",
    "NodeReport",
    "ProbeReport",
    "RunNames",
    "control_value",
]

# The kernel renews its lease this often; a node that sees no renewal for LEASE_SECONDS
# (the kernel died, or the node's network is gone) ends its node process.
CONTROL_PERIOD_SECONDS = 0.5
LEASE_SECONDS = 15.0

# The first byte of each frame a node process writes to its task: node 0's rendezvous
# address (for the task to publish), an event for the kernel's view, or the final outcome.
# An event is a pickled tuple whose first item says what it is: "output", "metrics",
# "print" (a line the node process printed, as the launcher prints in a local launch's
# kernel), "start", "finish", and a pool's "ready" and "answer".
ADDRESS, EVENT, OUTCOME = b"A", b"E", b"O"


@dataclass(frozen=True)
class RunNames:
    """The scheduler-side names of one run (one per kernel-side attempt)."""

    run_id: str

    @property
    def events(self) -> str:
        return f"notebook_kit-{self.run_id}-events"

    @property
    def control(self) -> str:
        return f"notebook_kit-{self.run_id}-control"

    @property
    def address(self) -> str:
        return f"notebook_kit-{self.run_id}-address"

    @property
    def commands(self) -> str:
        """A pool's commands to every node (a topic: none is lost, each arrives in order)."""
        return f"notebook_kit-{self.run_id}-commands"

    def started(self, node_rank: int) -> str:
        return f"notebook_kit-{self.run_id}-started-{node_rank}"

    def all_variables(self, num_nodes: int) -> list[str]:
        return [self.control, self.address, *(self.started(n) for n in range(num_nodes))]


def control_value(lease: int, stop: bool, abort: str) -> dict[str, Any]:
    """What the kernel publishes: a lease counter, the Stop request, an abort reason."""
    return {"lease": lease, "stop": stop, "abort": abort}


@dataclass(frozen=True)
class ProbeReport:
    """What a Dask worker said about itself before the run (``notebook_kit.node.probe``)."""

    worker: str
    host: str
    hostname: str
    python: str
    torch: str
    notebook_kit: str
    gpus: int
    interface: str | None  # the interface whose address reaches node 0
    local_address: str | None  # this worker's address on that interface
    rebuild_error: str | None  # why the function could not be unpickled there, if it failed


@dataclass(frozen=True)
class NodeOrder:
    """Everything one node needs; it travels inside the Dask task, not the environment.

    ``payload`` is the cloudpickled ``((function, args, kwargs), models)``; ``settings`` are
    the launcher options every node shares (``num_processes``, ``backend``, ...).
    """

    run_id: str
    node_rank: int
    num_nodes: int
    host: str
    interface: str | None
    payload: bytes
    settings: dict[str, Any]
    store_prefix: str
    lease_seconds: float = LEASE_SECONDS
    master: tuple[str, int] | None = None  # node 0's rendezvous; filled by the task
    host_nodes: int = 1  # nodes of this run on this node's host, which share its cores
    pool: bool = False  # keep the ranks and serve the kernel's commands (a cluster pool)
    restart_count: int = 0  # times the kernel started every node again before this attempt


@dataclass(frozen=True)
class NodeReport:
    """What a node task returns: the node process's outcome, or why there is none."""

    node_rank: int
    worker: str
    outcome: bytes | None = None  # cloudpickled outcome event of the node process
    ended_by: str = ""  # "", "lease", "abort", "refused", "died"
    exit_code: int | None = None
    notes: tuple[str, ...] = field(default=())
