"""Worker side of the Ray engine, run in a Ray worker: one node's Ray task, the runs' hub actor.

A node task is a Ray task placed in its bundle of the run's placement group
(:func:`run_ray_node`, through a :class:`RayNodeLink`). What the Dask scheduler holds for a run
(the control variable, node 0's address, the started marks, the event topic, a pool's command
topic) is held by a small actor, the :class:`RunHub`: one per kernel, serving each of its runs
until the run is forgotten. Starting an actor's process took about 4 s of a 7 s launch on 2
cores; the kernel's hub starts once.

The hub is an asyncio actor with no CPU of its own. A node task's event batch is one ``put``
call. The kernel's event thread, a node's control thread and a pool node's command thread each
wait in one long call (``take``, ``control``, ``commands_after``) that returns as soon as
something arrives: a node learns of Stop or an abort at once, and a running node's task calls
the hub about twice a second. Calls from one caller run in the order made, so each node's
batches, and the pool's commands, keep their order.

Runs in a Ray worker process (the hub: in its own). Imports ray only when called.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from notebook_kit.node.probe import node_environment, probe_report
from notebook_kit.node.protocol import (
    Control,
    NodeOrder,
    NodeReport,
    ProbeReport,
    Rendezvous,
    read_control,
)
from notebook_kit.node.task import SIGTERM_AGAIN_SECONDS, serve_node
from notebook_kit.node.zygote import local_zygote

__all__ = [
    "NodeKeeper",
    "RayNodeLink",
    "RunHub",
    "probe_ray_worker",
    "run_ray_node",
    "worker_started",
]

_RPC_SECONDS = 2.0  # no hub call of a node task waits longer, but the first:
_HUB_START_SECONDS = 60.0  # the hub's process starts with the node tasks'
_CLAIM_AGAIN_SECONDS = 0.05  # a claim that came before the kernel's first call asks again
_FORGOTTEN_KEPT = 10_000  # runs the hub remembers as forgotten (a late claim is refused)
_COMMAND_WAIT_SECONDS = 0.5  # a pool node's command thread asks again this often


class _RunState:
    """What the hub holds for one run."""

    def __init__(self, control: bytes) -> None:
        self.control = control
        self.master: tuple[str, int] | None = None
        self.started: dict[int, str] = {}
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.commands: list[bytes] = []
        self.arrived = asyncio.Event()
        self.commanded = asyncio.Event()
        self.changed = asyncio.Event()  # set when the control value changes but for its lease
        self.workers = 0  # worker processes started for the node tasks, before they are sent
        self.workers_ready = asyncio.Event()


def _but_lease(control: bytes) -> Control:
    return dataclasses.replace(read_control(control), lease=0)


class RunHub:
    """The runs' shared state on a Ray cluster, one entry per run (an actor by ``ray.remote``).

    A run's entry is made by its first ``set_control`` and dropped by ``forget``, which
    wakes its waiters; a call for a run the hub does not hold (forgotten) returns empty.
    """

    def __init__(self) -> None:
        self._runs: dict[str, _RunState] = {}
        self._forgotten: dict[str, None] = {}  # the latest forgotten runs, oldest first

    def runs(self) -> list[str]:
        """The runs held (none once every run was forgotten)."""
        return list(self._runs)

    def set_control(self, run: str, control: bytes) -> None:
        state = self._runs.get(run)
        if state is None:
            if run in self._forgotten:  # a publish that crossed the run's end: nothing to hold
                return
            self._runs[run] = _RunState(control)
            return
        moved = _but_lease(control) != _but_lease(state.control)
        state.control = control
        if moved:  # its waiters are woken; later ones wait
            state.changed.set()
            state.changed = asyncio.Event()

    async def control(
        self, run: str, known: bytes | None = None, wait: float = 0.0
    ) -> bytes | None:
        """The run's control value (None: forgotten). If it differs from ``known`` only in the
        lease, the answer waits up to ``wait`` seconds for another change: the kernel renews
        the lease twice a second, which alone wakes no node."""
        state = self._runs.get(run)
        if state is None:
            return None
        if known is not None and _but_lease(known) == _but_lease(state.control):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(state.changed.wait(), wait)
        state = self._runs.get(run)
        return None if state is None else state.control

    def claim(self, run: str, node: int, worker: str) -> bool | None:
        """Mark ``node`` started; False if it was already, or the run is forgotten; None if
        the kernel's first call for the run has not arrived yet (ask again)."""
        state = self._runs.get(run)
        if state is None:
            return False if run in self._forgotten else None
        if node in state.started:
            return False
        state.started[node] = worker
        return True

    def publish_master(self, run: str, host: str, port: int) -> None:
        state = self._runs.get(run)
        if state is not None:
            state.master = (host, port)

    def master(self, run: str) -> tuple[str, int] | None:
        state = self._runs.get(run)
        return None if state is None else state.master

    def put(self, run: str, node: int, events: list[bytes]) -> None:
        state = self._runs.get(run)
        if state is not None:
            state.events.append((time.time(), {"node": node, "events": events}))
            state.arrived.set()

    async def take(self, run: str, wait: float) -> list[tuple[float, dict[str, Any]]]:
        """Every batch of ``run`` that has arrived, waiting up to ``wait`` seconds for the
        first."""
        state = self._runs.get(run)
        if state is None:
            return []
        if not state.events:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(state.arrived.wait(), wait)
        taken, state.events = state.events, []
        state.arrived.clear()
        return taken

    async def worker_started(self, run: str, count: int, wait: float) -> None:
        """One more worker process for the run's node tasks has started; returns once
        ``count`` have (or after ``wait`` seconds): a process that returned at once would be
        given the next start-up task, and the node tasks would find fewer processes ready."""
        state = self._runs.get(run)
        if state is None:
            return
        state.workers += 1
        if state.workers >= count:
            state.workers_ready.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(state.workers_ready.wait(), wait)

    def command(self, run: str, data: bytes) -> None:
        state = self._runs.get(run)
        if state is not None:
            state.commands.append(data)
            state.commanded.set()
            state.commanded = asyncio.Event()  # its waiters are woken; later ones wait

    async def commands_after(self, run: str, seen: int, wait: float) -> list[bytes]:
        """The commands of ``run`` after the first ``seen``, waiting up to ``wait`` seconds
        for one."""
        state = self._runs.get(run)
        if state is None:
            return []
        if len(state.commands) <= seen:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(state.commanded.wait(), wait)
        return state.commands[seen:]

    def forget(self, run: str) -> None:
        """Drop ``run``'s state and wake whoever waits on it."""
        state = self._runs.pop(run, None)
        self._forgotten[run] = None
        if len(self._forgotten) > _FORGOTTEN_KEPT:
            del self._forgotten[next(iter(self._forgotten))]
        if state is not None:
            state.arrived.set()
            state.commanded.set()
            state.changed.set()
            state.workers_ready.set()


class NodeKeeper:
    """What a kernel keeps warm on one Ray node (made an actor by ``ray.remote``, pinned to
    its Ray node, with no CPU): the zygote that forks the node processes of its runs there,
    and a process that has imported what the probe imports.

    Ray ends an idle worker process when its node holds more than it has CPUs, and a node
    task's process with it, so a zygote in the node task's own process would not be there
    for the next run; an actor lives until the kernel that made it leaves Ray.
    """

    def __init__(self) -> None:
        self.zygote()  # it imports torch while the kernel probes

    def zygote(self) -> str:
        """The socket of this Ray node's zygote (started again if it died)."""
        return local_zygote(node_environment(None)).path

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` here (a probe, a shipping check)."""
        return function(*args)


class RayNodeLink:
    """A node task's link on a Ray cluster: calls to the :class:`RunHub`, for its run, and the
    zygote of its Ray node's :class:`NodeKeeper`."""

    def __init__(self, hub: Any, run: str, node_rank: int, worker: str, zygote: str) -> None:
        self._hub, self._run, self._node, self.worker = hub, run, node_rank, worker
        self._zygote = zygote
        self._listening = threading.Event()
        self._known: bytes | None = None  # the control value the hub last gave

    def _call(self, method: Any, *args: Any, wait: float = _RPC_SECONDS) -> Any:
        import ray

        return ray.get(method.remote(self._run, *args), timeout=wait)

    def claim(self) -> bool:
        """The node task's first call: the hub's process may still be starting, and the
        kernel's first call for the run may arrive after this one."""
        deadline = time.monotonic() + _HUB_START_SECONDS
        while True:
            left = max(deadline - time.monotonic(), 0.1)
            claimed = self._call(self._hub.claim, self._node, self.worker, wait=left)
            if claimed is not None or time.monotonic() > deadline:
                return bool(claimed)
            time.sleep(_CLAIM_AGAIN_SECONDS)

    def control(self, patience: float = 0.0) -> Control:
        """Waits in the hub up to ``patience`` seconds for the value to change from the last
        one it gave (but for the lease)."""
        control = self._call(self._hub.control, self._known, patience, wait=patience + _RPC_SECONDS)
        if control is None:  # forgotten (or not opened yet): as an unreachable scheduler
            raise LookupError(f"the hub holds no run {self._run}")
        self._known = control
        return read_control(control)

    def master(self) -> Rendezvous | None:
        published = self._call(self._hub.master)
        return Rendezvous(str(published[0]), int(published[1])) if published else None

    def publish_master(self, master: Rendezvous) -> None:
        self._call(self._hub.publish_master, master.host, master.port)

    def send(self, node: int, events: list[bytes]) -> None:
        self._hub.put.remote(self._run, node, events)  # not waited for: the relay never blocks

    def listen(self, commanded: Callable[[bytes], None]) -> None:
        self._listening.set()
        threading.Thread(
            target=self._follow, args=(commanded,), name="notebook_kit-commands", daemon=True
        ).start()

    def _follow(self, commanded: Callable[[bytes], None]) -> None:
        seen = 0
        while self._listening.is_set():
            try:
                commands = self._call(self._hub.commands_after, seen, _COMMAND_WAIT_SECONDS)
            except Exception:  # the hub is gone (the run was forgotten) or slow: ask again
                time.sleep(0.1)
                continue
            for command in commands:
                commanded(command)
            seen += len(commands)

    def close(self) -> None:
        self._listening.clear()

    def zygote(self, env: dict[str, str]) -> str:
        return self._zygote

    def hold_sigterm(self, forward: Callable[[], None]) -> Callable[[], None]:
        """A Ray worker told SIGTERM (its Ray node draining, a pod deleted) exits at once, and
        its node with it. The task runs on the worker's main thread, which takes the signal
        instead while the node runs: the node's ranks save first."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        received = threading.Event()

        def on_sigterm(signum: int, frame: Any) -> None:
            received.set()
            forward()

        previous = signal.signal(signal.SIGTERM, on_sigterm)

        def release() -> None:
            signal.signal(signal.SIGTERM, previous)
            if received.is_set():  # once the report is out: end as the signal asked
                again = threading.Timer(
                    SIGTERM_AGAIN_SECONDS, os.kill, (os.getpid(), signal.SIGTERM)
                )
                again.daemon = True
                again.start()

        return release


def run_ray_node(order: NodeOrder, hub: Any, worker: str, zygote: str, secret: bytes) -> NodeReport:
    """The Ray task of one node: run it, relay it, and report how it ended.

    ``secret`` is the run's: a task's argument, which Ray sends from the kernel to the worker
    that runs the task, never to the hub or Ray's control store.
    """
    link = RayNodeLink(hub, order.run_id, order.node_rank, worker, zygote)
    return serve_node(order, link, secret)


def worker_started(hub: Any, run: str, count: int, wait: float) -> int:
    """A Ray task that starts a worker process for one of ``count`` node tasks of ``run``, and
    holds it until all ``count`` have one (at most ``wait`` seconds): the process's id."""
    import ray

    ray.get(hub.worker_started.remote(run, count, wait), timeout=wait + _RPC_SECONDS)
    return os.getpid()


def probe_ray_worker(
    payload: bytes, node0_host: str, worker: str, host: str, gpus: int
) -> ProbeReport:
    """Run on the Ray node of ``worker``: describe it and try to rebuild the function.

    ``gpus`` are the Ray node's GPU resources (this task, holding none, sees none itself).
    """
    return probe_report(worker, host, payload, node0_host, gpus)
