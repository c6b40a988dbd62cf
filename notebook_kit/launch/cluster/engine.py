"""The kernel's side of a cluster engine: everything a cluster run asks of the cluster.

A cluster run (a launch's attempt, a pool's nodes) never calls an engine's own API, only its
:class:`Engine`: one class of :mod:`notebook_kit.launch.cluster.engines` (a row of its table),
whose node side is a :class:`~notebook_kit.node.task.NodeLink`. Nothing here imports an engine.

Runs in the kernel.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any, Protocol

from notebook_kit.launch.cluster.code_shipping import payload_asking
from notebook_kit.launch.cluster.engines import ENGINES
from notebook_kit.launch.cluster.probing import choose_workers
from notebook_kit.node.protocol import NodeOrder, NodeReport, ProbeReport, RunNames

__all__ = ["Engine", "NodeTask", "engine_for"]


class NodeTask(Protocol):
    """One submitted node task, as the kernel watches it."""

    def done(self) -> bool: ...

    def failure(self) -> str | None:
        """Why the task ended without a report (None: it finished, or is still running)."""

    def report(self) -> NodeReport: ...


class Engine(Protocol):
    """What a cluster run asks of its cluster (one implementation per kind of cluster).

    An engine subclasses it for ``choose``, ``present`` and ``ship``, which are written once
    here on top of ``workers`` and ``ask``."""

    worker_noun: str  # how a message names one machine of it: "Dask worker"
    ship_hint: str  # how a user sends a module to its workers, for a message naming the fix
    grow_hint: str  # how a user adds workers to it, for a message naming the fix

    def workers(self) -> dict[str, dict[str, Any]]:
        """The workers the cluster has now, by address, each with the ``host`` it runs on."""

    def ask(self, workers: list[str], function: Callable, *args: Any) -> list[Any]:
        """``function(*args)`` once on each of ``workers``, their answers in order (raises
        ``ClusterSetupError`` naming a worker that cannot answer in time)."""

    def probe(self, workers: list[str], payload: bytes) -> list[ProbeReport]:
        """Each worker's report on itself, and on rebuilding ``payload``."""

    def open_run(self, names: RunNames, num_nodes: int, events: Callable[[Any], None]) -> None:
        """Create the run's shared state, and call ``events`` with each node's event batch."""

    def publish(self, names: RunNames, control: bytes) -> None:
        """The control value every node task reads."""

    def submit(self, order: NodeOrder, worker: str, secret: bytes) -> NodeTask:
        """Start one node task on ``worker``, handing it the run's ``secret`` by a way that
        never leaves it with the cluster's shared state (the scheduler, the hub)."""

    def command(self, names: RunNames, data: bytes) -> None:
        """One encoded pool command to every node task, in order."""

    def forget(self, names: RunNames, num_nodes: int, tasks: list[NodeTask]) -> None:
        """Cancel the run's tasks and leave nothing of the run on the cluster."""

    def choose(
        self,
        num_nodes: int | None,
        min_nodes: int | None = None,
        exclude: frozenset[str] | set[str] = frozenset(),
    ) -> list[str]:
        """One worker per node, by address: ``num_nodes`` of them (default one per host), or
        as many as there are down to ``min_nodes``; never one in ``exclude`` (raises
        ``ValueError`` for too few, in the engine's words)."""
        usable = {a: info for a, info in self.workers().items() if a not in exclude}
        return choose_workers(usable, num_nodes, min_nodes, self.worker_noun, self.grow_hint)

    def present(self) -> set[str]:
        """The workers the cluster has now."""
        return set(self.workers())

    def ship(self, workers: list[str], obj: Any) -> bytes:
        """``obj`` pickled so that every chosen worker's node process can rebuild it."""
        return payload_asking(functools.partial(self.ask, workers), obj)


def engine_for(cluster: Any) -> Engine:
    """The engine of ``cluster=``: the first row of the engine table that takes the value.

    Raises:
        TypeError: no engine takes ``cluster`` (the message names every accepted form).
    """
    for row in ENGINES:
        if row.takes(cluster):
            module_name, _, name = row.engine.partition(":")
            make: Callable[[Any], Engine] = getattr(importlib.import_module(module_name), name)
            return make(cluster)
    forms = "; ".join(row.forms for row in ENGINES)
    raise TypeError(f"cluster must be one of: {forms}; got {type(cluster).__name__}.")
