"""How a cluster run names a failure: the rank, its node and that node's machine, in the words
of its engine ("Dask worker tcp://...")."""

from __future__ import annotations

import dataclasses
import time

from notebook_kit.errors import WorkerError, WorkerFailure

__all__ = ["ClusterWorkerError", "node_lost", "on_kernel_clock"]


class ClusterWorkerError(WorkerError):
    """A rank failed or a node was lost; the message says which node and worker.

    Attributes:
        nodes: For each node rank, its worker's address.
        ranks_per_node: Ranks on each node (global rank = node * ranks_per_node + local).
        lost_nodes: Nodes whose worker died or went silent.
        worker_noun: What the engine calls one of its workers ("Dask worker").
    """

    def __init__(
        self,
        failures: list[WorkerFailure],
        world_size: int,
        nodes: list[str],
        lost_nodes: tuple[int, ...] = (),
        worker_noun: str = "Dask worker",
    ) -> None:
        self.nodes = nodes
        self.worker_noun = worker_noun
        self.ranks_per_node = max(world_size // max(len(nodes), 1), 1)
        self.lost_nodes = lost_nodes
        super().__init__(failures, world_size)

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def restart_reason(self) -> str:
        """The root failure, naming its node: a lost node's own words ("node 1 lost: ..."),
        else the rank, its node and worker, and what it raised."""
        root = self.failure
        node = self.node_of(root.rank)
        if node in self.lost_nodes:
            return root.summary()
        return f"{self._named(root.rank)} failed ({root.summary()})"

    def _named(self, rank: int) -> str:
        node = self.node_of(rank)
        return f"Rank {rank} (node {node}, {self.worker_noun} {self.nodes[node]})"


def node_lost(node: int, rank: int, worker: str, why: str, noun: str) -> WorkerFailure:
    """The failure that stands for a whole node that is gone (no traceback can come from it)."""
    return WorkerFailure(
        rank=rank,
        exit_code=None,
        exception_type=None,
        message=f"node {node} lost: {why} ({noun} {worker})",
        traceback="",
        time=time.monotonic(),
    )


def on_kernel_clock(failures: tuple[WorkerFailure, ...], arrived: float) -> list[WorkerFailure]:
    """A node's failures with their times moved to the kernel's clock, order kept.

    Monotonic clocks of two machines cannot be compared; the kernel orders nodes by when
    their reports arrived, and a node's own failures by their times there.
    """
    if not failures:
        return []
    first = min(failure.time for failure in failures)
    return [dataclasses.replace(f, time=arrived + (f.time - first)) for f in failures]
