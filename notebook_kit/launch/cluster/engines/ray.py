"""Kernel side of the Ray engine, run in the kernel: ``notebook_launcher(cluster="ray")``.

``cluster="ray"`` runs on the Ray cluster this kernel joined with ``ray.init(...)``;
``cluster="ray://head:10001"`` first connects a Ray client to that cluster's head. A string
names the cluster because a Ray cluster has no client object to pass, as Dask's ``Client``
is: ``ray.init`` joins the process to one cluster, and every Ray call then goes there.

The run's nodes are Ray tasks, one per node, each in its bundle of one placement group made
for the attempt: ``num_processes`` CPUs (and as many GPUs, on a Ray node that has them), one
bundle per Ray node (``STRICT_SPREAD``), or, as with Dask, several nodes on one Ray node when
``num_nodes`` is above their number (each bundle pinned to the Ray node it was probed on). The
run's state (control value, node 0's address, events, a pool's commands) lives in the kernel's
:class:`~notebook_kit.node.links.ray.RunHub` actor (:mod:`.ray_actors`); the run's entry there
and the group go when the attempt is forgotten.

A worker, as the rest of the cluster run names it, is one place for a node on a Ray node: a
Ray node holds as many as it has CPUs, named ``ip/node-id#k``. A node task whose Ray worker
process died renames its place (``#k.1``): Ray starts a fresh process there, and a restart
(``max_restarts``) may use it, as a Dask nanny's fresh worker is used.

Runs in the kernel.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from notebook_kit.launch.cluster.engine import Engine
from notebook_kit.launch.cluster.engines.ray_actors import (
    HUB_SECONDS,
    cancel_task,
    keeper,
    kernel_hub,
    remote_once,
)
from notebook_kit.launch.cluster.engines.ray_placing import (
    check_room,
    reserve,
    start_workers,
    wait_reserved,
)
from notebook_kit.launch.cluster.probing import PROBE_TIMEOUT_SECONDS, ClusterSetupError
from notebook_kit.node.links.ray import probe_ray_worker, run_ray_node
from notebook_kit.node.protocol import (
    Control,
    NodeOrder,
    NodeReport,
    ProbeReport,
    RunNames,
    control_frame,
)

__all__ = ["INSTALL_HINT", "RayEngine", "ray_engine"]

INSTALL_HINT = "pip install 'notebook_kit[ray]'"
_TAKE_SECONDS = 0.5  # the kernel's event thread waits this long in one call to the hub
_REACH_SECONDS = 10.0  # a ray:// head that takes no connection in this long is unreachable


def ray_engine(handle: str) -> RayEngine:
    """The engine of ``cluster="ray"`` or ``cluster="ray://host:port"``.

    Raises:
        ImportError: ray is not installed (the message says how to install it).
        ValueError: ``handle`` is another string, or the kernel has not joined the cluster
            ``"ray"`` names, or has joined another than the one ``"ray://..."`` names, or
            ``"ray://..."`` names no host and port.
        ConnectionError: no Ray client server answers where ``"ray://..."`` points.
    """
    if handle != "ray" and not handle.startswith("ray://"):
        raise ValueError(
            f"cluster={handle!r} is not a cluster: pass a Dask Client (or a cluster with "
            f".get_client()), 'ray' for the Ray cluster this kernel joined with ray.init(...), "
            f"or 'ray://host:10001' to connect to a Ray cluster's head."
        )
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            f"cluster={handle!r} runs the launch on a Ray cluster, which needs ray: {INSTALL_HINT}."
        ) from error
    if handle == "ray":
        if not ray.is_initialized():
            raise ValueError(
                "cluster='ray' runs on the Ray cluster this kernel joined with ray.init(...), "
                "and it has joined none: call ray.init(address='auto') on a Ray node (or "
                "ray.init() for a Ray instance on this machine) first, or pass "
                "cluster='ray://head:10001' to connect to a cluster's head."
            )
    elif not ray.is_initialized():
        _connect(ray, handle)
    elif _client_address() not in (handle.removeprefix("ray://"), ""):
        raise ValueError(
            f"cluster={handle!r}: this kernel has joined another Ray cluster already "
            f"(ray.init was called). Pass cluster='ray' to run there, or call ray.shutdown() "
            f"first."
        )
    return RayEngine()


def _head_address(handle: str) -> tuple[str, int]:
    """The host and port a ``ray://`` handle names (raises ValueError naming the fix)."""
    try:
        parts = urllib.parse.urlsplit(handle)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or port is None:
        raise ValueError(
            f"cluster={handle!r} names no host and port: pass 'ray://HEAD:PORT', the Ray head's "
            f"address and its Ray client server's port (10001 unless `ray start --head "
            f"--ray-client-server-port` set another)."
        )
    return host, port


def _connect(ray: Any, handle: str) -> None:
    """Connect this kernel's Ray client to the head ``handle`` names.

    A port that refuses the connection is told at once, not after Ray's client has retried
    for 30 s. After a failed attempt Ray is shut down again: Ray's client leaves the process
    unable to ``ray.init`` anything until then.

    Raises:
        ValueError: the handle names no host and port.
        ConnectionError: nothing accepts connections there, or no Ray client server answered.
    """
    host, port = _head_address(handle)
    try:
        socket.create_connection((host, port), timeout=_REACH_SECONDS).close()
    except OSError as error:
        why = error.strerror or type(error).__name__
        raise ConnectionError(
            f"cluster={handle!r}: nothing accepts connections at {host}:{port} ({why}). "
            f"Pass the address of a Ray head whose Ray client server this kernel can reach: "
            f"`ray start --head` serves Ray clients on port 10001 "
            f"(--ray-client-server-port sets another)."
        ) from None
    try:
        ray.init(address=handle)
    except BaseException as error:
        ray.shutdown()
        if not isinstance(error, ConnectionError):
            raise
        raise ConnectionError(
            f"cluster={handle!r}: {host}:{port} accepts connections, but no Ray client server "
            f"answered there ({error}). Pass the port of the head's Ray client server (10001 "
            f"unless --ray-client-server-port set another), not its GCS port (6379), which "
            f"ray.init(address='auto') joins from a Ray node. A head that requires token "
            f"authentication (RAY_AUTH_MODE=token there) also answers no client without its "
            f"token: set RAY_AUTH_MODE=token in this kernel's environment too, with the "
            f"head's token in ~/.ray/auth_token or RAY_AUTH_TOKEN."
        ) from error


def _client_address() -> str | None:
    """``host:port`` of this kernel's Ray client connection: None when the kernel is not a
    Ray client, "" when Ray does not say."""
    from ray.util.client import ray as client

    if not client.is_connected():
        return None
    return str(getattr(client.get_context().client_worker, "_conn_str", ""))


class _Place:
    """Where a worker is: its Ray node, that node's address and GPUs."""

    def __init__(self, node_id: str, ip: str, gpus: int) -> None:
        self.node_id, self.ip, self.gpus = node_id, ip, gpus


class _RayTask:
    """One node task, as the kernel watches it (its ref exists once the group is ready)."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.ref: Any = None
        self._future: concurrent.futures.Future | None = None

    def done(self) -> bool:
        if self.ref is None:
            return False
        if self._future is None:  # Ray's own thread completes it: a look costs no Ray call
            self._future = self.ref.future()
        return self._future.done()

    def failure(self) -> str | None:
        if not self.done():
            return None
        error = self._future.exception()
        return None if error is None else _why(error)

    def report(self) -> NodeReport:
        return self._future.result()


def _why(error: BaseException) -> str:
    """Why a node task ended without its report, as "node 1 lost: ..." goes on."""
    from ray import exceptions

    if isinstance(error, exceptions.NodeDiedError):
        return "its Ray node died"
    if isinstance(error, exceptions.WorkerCrashedError):
        return "its Ray worker process died"
    if isinstance(error, exceptions.TaskCancelledError):
        return "its Ray task was cancelled"
    first = (str(error).strip().splitlines() or [""])[0]
    return f"its Ray task failed ({type(error).__name__}: {first})"


class _Run:
    """What one attempt holds on the cluster: a hub entry, a placement group, an event thread."""

    def __init__(self, hub: Any, run_id: str) -> None:
        self.hub, self.run_id = hub, run_id
        self.group: Any = None
        self.secret = b""  # the run's, for its node tasks' arguments
        self.waiting: list[tuple[NodeOrder, _RayTask]] = []
        self.pump: threading.Thread | None = None
        self.forgotten = threading.Event()


class RayEngine(Engine):
    """The Ray cluster this kernel joined (``ray.init``, or a Ray client connection)."""

    worker_noun = "Ray worker"
    ship_hint = "Ray's runtime environment (ray.init(runtime_env={'py_modules': [...]}))"
    grow_hint = "Add Ray nodes (ray start --address=HEAD:6379 on another machine) or CPUs"

    def __init__(self) -> None:
        self._renamed: dict[str, int] = {}  # a place's base name -> times its process died
        self._places: dict[str, _Place] = {}
        self._runs: dict[str, _Run] = {}

    # -- the workers ------------------------------------------------------------------------

    def _read_places(self) -> dict[str, _Place]:
        """Every place of the alive Ray nodes now: one per CPU of each."""
        import ray

        places: dict[str, _Place] = {}
        for node in ray.nodes():
            resources = node.get("Resources", {})
            if not node.get("Alive") or resources.get("CPU", 0) < 1:
                continue
            node_id, ip = str(node["NodeID"]), str(node["NodeManagerAddress"])
            for k in range(int(resources["CPU"])):
                base = f"{ip}/{node_id[:8]}#{k}"
                renamed = self._renamed.get(base, 0)
                name = f"{base}.{renamed}" if renamed else base
                places[name] = _Place(node_id, ip, int(resources.get("GPU", 0)))
        self._places.update(places)
        return places

    def workers(self) -> dict[str, dict[str, Any]]:
        """One per CPU of each Ray node, which is their ``host``: a node per Ray node first."""
        return {name: {"host": place.node_id} for name, place in self._read_places().items()}

    # -- before the run: shipping and probing -------------------------------------------------

    def _ask(
        self, workers: list[str], function: Callable, arguments: Callable[[str], tuple]
    ) -> list[Any]:
        """``function(*arguments(worker))`` on the Ray node of each worker, for each worker in
        order: asked once per Ray node, in parallel, as every place of one Ray node is the same
        machine and environment, in the kernel's keeper there (made by the first ask), which
        answers warm from the second launch on."""
        import ray

        asking: dict[str, str] = {}  # a Ray node's id -> the first of its workers
        for worker in workers:
            asking.setdefault(self._places[worker].node_id, worker)
        askers = list(asking.values())
        refs = [
            keeper(self._places[worker].node_id).call.remote(function, *arguments(worker))
            for worker in askers
        ]
        try:
            answers = dict(zip(askers, ray.get(refs, timeout=PROBE_TIMEOUT_SECONDS), strict=True))
        except ray.exceptions.GetTimeoutError as error:
            _, waiting = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in waiting:  # never started: its Ray node has no process for the keeper
                cancel_task(ref)
            silent = [w for w, ref in zip(askers, refs, strict=True) if ref in waiting]
            raise ClusterSetupError(
                f"Ray worker{'s' if len(silent) > 1 else ''} {', '.join(silent)} did not "
                f"answer the probe within {PROBE_TIMEOUT_SECONDS:g} s: its Ray node could not "
                f"start a worker process in time (ray status shows what runs there)."
            ) from error
        return [answers[asking[self._places[worker].node_id]] for worker in workers]

    def ask(self, workers: list[str], function: Callable, *args: Any) -> list[Any]:
        return self._ask(workers, function, lambda _: args)

    def probe(self, workers: list[str], payload: bytes) -> list[ProbeReport]:
        node0 = self._places[workers[0]].ip

        def arguments(worker: str) -> tuple[Any, ...]:
            place = self._places[worker]
            return (payload, node0, worker, place.ip, place.gpus)

        reports = self._ask(workers, probe_ray_worker, arguments)
        return [  # each report as its own worker's (its Ray node's first worker probed)
            dataclasses.replace(report, worker=worker)
            for worker, report in zip(workers, reports, strict=True)
        ]

    # -- one attempt ----------------------------------------------------------------------

    def _run(self, names: RunNames, control: bytes | None = None) -> _Run | None:
        run = self._runs.get(names.run_id)
        if run is None and control is not None:
            run = self._runs[names.run_id] = _Run(kernel_hub(), names.run_id)
            run.hub.set_control.remote(run.run_id, control)
        return run

    def open_run(self, names: RunNames, num_nodes: int, events: Callable[[Any], None]) -> None:
        run = self._run(names, control_frame(Control()))
        assert run is not None
        run.pump = threading.Thread(
            target=_pump, args=(run, events), name="notebook_kit-ray-events", daemon=True
        )
        run.pump.start()

    def publish(self, names: RunNames, control: bytes) -> None:
        """Not waited for: each value is the whole state (a counter, and flags that stay set),
        and the kernel's first run waits for no hub process to start."""
        run = self._run(names, control)
        if run is not None and not run.forgotten.is_set():
            run.hub.set_control.remote(run.run_id, control)

    def submit(self, order: NodeOrder, worker: str, secret: bytes) -> _RayTask:
        """Queue the node; with the last node of the run, reserve every node's bundle
        together, then start every node task in its bundle."""
        run = self._run(RunNames(order.run_id))
        assert run is not None, "open_run first"
        task = _RayTask(worker)
        run.secret = secret
        run.waiting.append((order, task))
        if len(run.waiting) == order.num_nodes:
            self._start(run)
        return task

    def _start(self, run: _Run) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        orders = [order for order, _ in run.waiting]
        workers = [task.worker for _, task in run.waiting]
        shapes = [self._bundle(order, task.worker) for order, task in run.waiting]
        nodes = [self._places[task.worker].node_id for _, task in run.waiting]
        bound = orders[0].settings.rendezvous_timeout
        check_room(shapes, nodes, workers)
        run.group = reserve(shapes, nodes)  # kept at once: forget removes it, come what may
        wait_reserved(run.group, shapes, workers, bound)
        start_workers(run.group, shapes, bound, run.hub, run.run_id)
        # Once per Ray node, not per node: each call reads the node's environment (tenths of a
        # second on a busy machine), and 64 nodes on one Ray node waited minutes for them.
        keepers = {node: keeper(node) for node in dict.fromkeys(nodes)}
        sockets = ray.get([kept.zygote.remote() for kept in keepers.values()], timeout=bound)
        by_node = dict(zip(keepers, sockets, strict=True))
        zygotes = [by_node[node] for node in nodes]
        node_task = remote_once(run_ray_node)
        for index, (order, task) in enumerate(run.waiting):
            task.ref = node_task.options(
                num_cpus=shapes[index]["CPU"],
                num_gpus=shapes[index].get("GPU", 0),
                max_retries=0,
                name=f"notebook_kit node {order.node_rank}",
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    run.group, placement_group_bundle_index=index
                ),
            ).remote(order, run.hub, task.worker, zygotes[index], run.secret)

    def _bundle(self, order: NodeOrder, worker: str) -> dict[str, float]:
        """A node's resources: a CPU per rank, and a GPU per rank on a Ray node with enough
        (as a local launch gives each rank a GPU when every rank has one)."""
        processes = order.settings.num_processes
        bundle = {"CPU": float(processes)}
        if self._places[worker].gpus >= processes:
            bundle["GPU"] = float(processes)
        return bundle

    def command(self, names: RunNames, data: bytes) -> None:
        import ray

        run = self._run(names)
        assert run is not None
        ray.get(run.hub.command.remote(run.run_id, data), timeout=HUB_SECONDS)

    def forget(self, names: RunNames, num_nodes: int, tasks: list[Any]) -> None:
        """Cancel what still runs, remove the placement group, drop the run from the hub."""
        import ray
        from ray.util.placement_group import remove_placement_group

        run = self._runs.pop(names.run_id, None)
        if run is None:
            return
        run.forgotten.set()
        for task in tasks:
            if not isinstance(task, _RayTask):
                continue
            if task.ref is not None and not task.done():
                cancel_task(task.ref)
            if task.ref is not None and (not task.done() or task.failure() is not None):
                base = task.worker.rsplit(".", 1)[0] if _renamed(task.worker) else task.worker
                self._renamed[base] = self._renamed.get(base, 0) + 1
        if run.group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(run.group)
        with contextlib.suppress(Exception):  # waited for: then nothing of the run is left
            ray.get(run.hub.forget.remote(run.run_id), timeout=HUB_SECONDS)
        if run.pump is not None:
            run.pump.join(timeout=HUB_SECONDS)


def _renamed(worker: str) -> bool:
    """Whether a place's name carries a renaming (``ip/node#k.1``)."""
    return "." in worker.rsplit("#", 1)[-1]


def _pump(run: _Run, events: Callable[[Any], None]) -> None:
    """The kernel's event thread: hands every batch the hub holds to ``events``."""
    import ray

    while not run.forgotten.is_set():
        try:
            batches = ray.get(run.hub.take.remote(run.run_id, _TAKE_SECONDS), timeout=HUB_SECONDS)
        except Exception:  # the hub is slow, or gone with the Ray connection: look again
            time.sleep(0.05)
            continue
        for batch in batches:
            events(batch)
