"""The kernel's side of a cluster engine: everything a cluster run asks of the cluster.

A cluster run (a launch's attempt, a pool's nodes) never calls the engine's own API: it asks an
:class:`Engine` to choose and probe workers, ship the payload, open a run's shared state,
submit one node task per node, publish the control value, carry the events and commands, watch
which workers are present, and forget the run. :class:`DaskEngine` does it on a Dask cluster;
:class:`~notebook_kit.launch.cluster.engines.ray.RayEngine` on a Ray cluster. An engine is one
class on this side and one node-side link (:class:`~notebook_kit.node.task.NodeLink`).

Runs in the kernel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from notebook_kit.launch.cluster.code_shipping import payload_for_nodes
from notebook_kit.launch.cluster.engines.dask import choose_workers, current_workers, dask_client
from notebook_kit.launch.cluster.probing import probe_workers
from notebook_kit.node.protocol import NodeOrder, NodeReport, ProbeReport, RunNames
from notebook_kit.node.task import run_node

__all__ = ["DaskEngine", "Engine", "NodeTask", "engine_for"]

_UNSUBSCRIBED_SECONDS = 2.0  # at most this long, the run's topics wait for subscribers to leave


class NodeTask(Protocol):
    """One submitted node task, as the kernel watches it."""

    def done(self) -> bool: ...

    def failure(self) -> str | None:
        """Why the task ended without a report (None: it finished, or is still running)."""

    def report(self) -> NodeReport: ...


class Engine(Protocol):
    """What a cluster run asks of its cluster (one implementation per kind of cluster)."""

    worker_noun: str  # how a message names one machine of it: "Dask worker"
    ship_hint: str  # how a user sends a module to its workers, for a message naming the fix
    grow_hint: str  # how a user adds workers to it, for a message naming the fix

    def choose(
        self,
        num_nodes: int | None,
        min_nodes: int | None = None,
        exclude: frozenset[str] | set[str] = frozenset(),
    ) -> list[str]:
        """One worker per node, by address: ``num_nodes`` of them (default one per host), or
        as many as there are down to ``min_nodes``; never one in ``exclude`` (raises
        ``ValueError`` for too few)."""

    def ship(self, workers: list[str], obj: Any) -> bytes:
        """``obj`` pickled so that every chosen worker's node process can rebuild it."""

    def probe(self, workers: list[str], payload: bytes) -> list[ProbeReport]:
        """Each worker's report on itself, and on rebuilding ``payload``."""

    def present(self) -> set[str]:
        """The workers the cluster has now."""

    def open_run(self, names: RunNames, num_nodes: int, events: Callable[[Any], None]) -> None:
        """Create the run's shared state, and call ``events`` with each node's event batch."""

    def publish(self, names: RunNames, control: dict[str, Any]) -> None:
        """The control value every node task reads."""

    def submit(self, order: NodeOrder, worker: str, secret: bytes) -> NodeTask:
        """Start one node task on ``worker``, handing it the run's ``secret`` by a way that
        never leaves it with the cluster's shared state (the scheduler, the hub)."""

    def command(self, names: RunNames, data: bytes) -> None:
        """One encoded pool command to every node task, in order."""

    def forget(self, names: RunNames, num_nodes: int, tasks: list[NodeTask]) -> None:
        """Cancel the run's tasks and leave nothing of the run on the cluster."""


class _DaskTask:
    def __init__(self, future: Any, secret: Any = None) -> None:
        self.future = future
        self.secret = secret  # the scattered secret's future: kept while the task runs

    def done(self) -> bool:
        return bool(self.future.done())

    def failure(self) -> str | None:
        status = self.future.status
        return None if status in ("finished", "pending") else f"its node task ended with {status}"

    def report(self) -> NodeReport:
        return self.future.result()


class DaskEngine:
    """A Dask cluster, through its ``distributed.Client``."""

    worker_noun = "Dask worker"
    ship_hint = "client.upload_file(path) or Dask's UploadDirectory plugin"
    grow_hint = "Add workers (cluster.scale(...))"

    def __init__(self, client: Any) -> None:
        self.client = client

    def choose(
        self,
        num_nodes: int | None,
        min_nodes: int | None = None,
        exclude: frozenset[str] | set[str] = frozenset(),
    ) -> list[str]:
        workers = current_workers(self.client)
        usable = {address: info for address, info in workers.items() if address not in exclude}
        return choose_workers(usable, num_nodes, min_nodes)

    def ship(self, workers: list[str], obj: Any) -> bytes:
        return payload_for_nodes(self.client, workers, obj)

    def probe(self, workers: list[str], payload: bytes) -> list[ProbeReport]:
        return probe_workers(self.client, workers, payload)

    def present(self) -> set[str]:
        return set(current_workers(self.client))

    def open_run(self, names: RunNames, num_nodes: int, events: Callable[[Any], None]) -> None:
        from distributed import Variable

        # Set before any task runs, so a task only ever reads a variable that exists: empty
        # means node 0 has not published yet, or this node has not started yet.
        Variable(names.address, client=self.client).set([])
        for node in range(num_nodes):
            Variable(names.started(node), client=self.client).set("")
        self.client.subscribe_topic(names.events, events)

    def publish(self, names: RunNames, control: dict[str, Any]) -> None:
        from distributed import Variable

        Variable(names.control, client=self.client).set(control)

    def submit(self, order: NodeOrder, worker: str, secret: bytes) -> NodeTask:
        """The secret goes to ``worker`` itself (``direct``: the client sends the bytes to the
        worker, and tells the scheduler only the key and where it lies); the node task,
        pinned there, reads it there."""
        held = self.client.scatter(secret, workers=[worker], direct=True, hash=False)
        future = self.client.submit(
            run_node, order, held.key, workers=[worker], allow_other_workers=False, pure=False,
            retries=0,
        )  # fmt: skip
        return _DaskTask(future, held)

    def command(self, names: RunNames, data: bytes) -> None:
        self.client.log_event(names.commands, data)

    def forget(self, names: RunNames, num_nodes: int, tasks: list[NodeTask]) -> None:
        self.client.unsubscribe_topic(names.events)
        futures = [
            future
            for task in tasks
            if isinstance(task, _DaskTask)
            for future in (task.future, task.secret)
            if future is not None
        ]
        self.client.cancel(futures, force=True)
        variables = names.all_variables(num_nodes)
        topics = [names.events, names.commands, *(f"variable-{name}" for name in variables)]
        self.client.run_on_scheduler(forget_on_scheduler, variables, topics)


def engine_for(cluster: Any) -> Engine:
    """The engine of ``cluster=``: a Dask ``Client``, or an object with ``get_client()``;
    ``"ray"`` (the Ray cluster this kernel joined with ``ray.init``) or ``"ray://host:port"``
    (a Ray client connection to that cluster's head)."""
    if isinstance(cluster, str):
        from notebook_kit.launch.cluster.engines.ray import ray_engine

        return ray_engine(cluster)
    return DaskEngine(dask_client(cluster))


async def forget_on_scheduler(
    names: list[str], topics: list[str], dask_scheduler: Any = None
) -> None:
    """On the scheduler: delete the run's variables, then drop the run's event logs.

    One call, so nothing is logged after the logs are dropped: deleting a variable itself
    logs to a topic named after it. The scheduler keeps up to
    ``distributed.admin.low-level-log-length`` events per topic and has no call to forget a
    topic; its event broker is asked directly, if it is there.

    An unsubscribe (the kernel's from the events, a pool node's from the commands) travels on
    its client's batched stream, not with this call, and one handled after the topic is gone
    would bring it back empty: each topic is dropped once its last subscriber has left, or
    after ``_UNSUBSCRIBED_SECONDS`` at most.
    """
    variables = dask_scheduler.extensions.get("variables")
    for name in names:
        if variables is not None:
            await variables.delete(name=name)
    broker = getattr(dask_scheduler, "_broker", None)
    known = getattr(broker, "_topics", None)
    if not isinstance(known, dict):
        return
    deadline = time.monotonic() + _UNSUBSCRIBED_SECONDS
    while time.monotonic() < deadline and any(
        getattr(known.get(topic), "subscribers", None) for topic in topics
    ):
        await asyncio.sleep(0.01)
    for topic in topics:
        known.pop(topic, None)
