"""Kernel side of the Dask engine, run in the kernel: ``notebook_launcher(cluster=client)``.

A Dask ``Client`` (or anything with ``.get_client()``: Coiled, dask-jobqueue, dask-kubernetes,
``LocalCluster``, :func:`~notebook_kit.launch.cluster.engines.dask_local.local_cluster`)
reaches the machines. :class:`DaskEngine` keeps a run's shared state in the scheduler's
variables and topics, and submits :func:`~notebook_kit.node.links.dask.run_node` once per node.
Each question to the workers is one short Dask task per chosen worker, which needs a free
thread there: a worker whose threads all run other tasks (the user's own, another kernel's
run) is named at once rather than after the probe's timeout.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

from notebook_kit.launch.cluster.engine import Engine, NodeTask
from notebook_kit.launch.cluster.probing import (
    PROBE_TIMEOUT_SECONDS,
    ClusterSetupError,
    choose_workers,
)
from notebook_kit.node.links.dask import probe_worker, run_node
from notebook_kit.node.protocol import NodeOrder, NodeReport, ProbeReport, RunNames

__all__ = [
    "INSTALL_HINT", "DaskEngine", "choose_workers", "current_workers", "dask_client", "dask_engine",
    "forget_on_scheduler",
]  # fmt: skip

INSTALL_HINT = "pip install 'notebook_kit[cluster]'  (installs dask and distributed)"
_UNSUBSCRIBED_SECONDS = 2.0  # at most this long, the run's topics wait for subscribers to leave


def dask_engine(cluster: Any) -> DaskEngine:
    """The engine of ``cluster=`` a Dask ``Client``, or an object with ``get_client()``."""
    return DaskEngine(dask_client(cluster))


def dask_client(cluster: Any) -> Any:
    """The ``distributed.Client`` for ``cluster=``: a Client, or an object with ``get_client()``.

    Raises:
        ImportError: Dask's ``distributed`` is not installed (the message says how to).
        TypeError: ``cluster`` is neither.
    """
    try:
        from distributed import Client
    except ImportError as error:
        raise ImportError(
            f"cluster= runs the launch on a Dask cluster, which needs dask and distributed: "
            f"{INSTALL_HINT}."
        ) from error
    if isinstance(cluster, Client):
        return cluster
    get_client = getattr(cluster, "get_client", None)
    if callable(get_client):
        client = get_client()
        if isinstance(client, Client):
            return client
    raise TypeError(
        f"cluster must be a distributed.Client or a cluster object with .get_client() "
        f"(LocalCluster, coiled.Cluster, SLURMCluster, ...), got {type(cluster).__name__}."
    )


def current_workers(client: Any) -> dict[str, dict[str, Any]]:
    """The scheduler's workers now, asked directly.

    ``Client.scheduler_info()`` returns a cached copy that the client's own periodic refresh
    may have just replaced with one listing no workers.
    """
    return dict(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


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


class DaskEngine(Engine):
    """A Dask cluster, through its ``distributed.Client``."""

    worker_noun = "Dask worker"
    ship_hint = "client.upload_file(path) or Dask's UploadDirectory plugin"
    grow_hint = "Scale the cluster first (cluster.scale(n), then client.wait_for_workers(n))"

    def __init__(self, client: Any) -> None:
        self.client = client

    def workers(self) -> dict[str, dict[str, Any]]:
        return current_workers(self.client)

    def ask(self, workers: list[str], function: Callable, *args: Any) -> list[Any]:
        refuse_busy_workers(self.client, workers)
        futures = [
            self.client.submit(
                function,
                *args,
                workers=[address],
                allow_other_workers=False,
                pure=False,
                retries=0,
            )
            for address in workers
        ]
        from distributed import wait

        try:
            wait(futures, timeout=PROBE_TIMEOUT_SECONDS)
            return self.client.gather(futures)
        except TimeoutError as error:
            silent = [
                address
                for address, future in zip(workers, futures, strict=True)
                if not future.done()
            ]
            raise ClusterSetupError(
                f"Dask worker{'s' if len(silent) > 1 else ''} {', '.join(silent)} did not answer "
                f"the probe within {PROBE_TIMEOUT_SECONDS:g} s: each chosen worker needs a free "
                f"thread, and a worker too loaded to start a Python process in time cannot run a "
                f"node. Wait for its running tasks to finish, or add workers."
            ) from error
        finally:
            self.client.cancel(futures, force=True)

    def probe(self, workers: list[str], payload: bytes) -> list[ProbeReport]:
        node0_host = workers[0].split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
        return self.ask(workers, probe_worker, payload, node0_host)

    def open_run(self, names: RunNames, num_nodes: int, events: Callable[[Any], None]) -> None:
        from distributed import Variable

        # Set before any task runs, so a task only ever reads a variable that exists: empty
        # means node 0 has not published yet, or this node has not started yet.
        Variable(names.address, client=self.client).set([])
        for node in range(num_nodes):
            Variable(names.started(node), client=self.client).set("")
        self.client.subscribe_topic(names.events, events)

    def publish(self, names: RunNames, control: bytes) -> None:
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


def refuse_busy_workers(client: Any, workers: list[str]) -> None:
    """Name the first chosen worker whose every thread runs a task already."""
    known = current_workers(client)
    processing = client.processing(workers)
    for address in workers:
        threads = int(known.get(address, {}).get("nthreads", 1) or 1)
        running = list(processing.get(address, ()))
        if len(running) >= threads:
            shown = ", ".join(map(str, running[:3])) + (", ..." if len(running) > 3 else "")
            raise ClusterSetupError(
                f"Dask worker {address} has no free thread: its {threads} thread"
                f"{'s run' if threads > 1 else ' runs'} other tasks ({shown}), and a node "
                f"needs one for the whole run. Wait for those tasks to finish (or cancel "
                f"them), start the worker with more threads, or add workers."
            )


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


# Dask's words for too few workers, as the engine's choice says them.
choose_workers = functools.partial(
    choose_workers, worker_noun=DaskEngine.worker_noun, grow_hint=DaskEngine.grow_hint
)
