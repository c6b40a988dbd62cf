"""The node task on a Ray cluster: a Ray task that serves one node, and the run's hub actor.

A cluster run on Ray (``notebook_launcher(cluster="ray")``) shares everything with the Dask
path but the engine: the node task is a Ray task placed in its bundle of the run's placement
group, and :func:`run_ray_node` serves its node with :func:`~notebook_kit.node.task.serve_node`
through a :class:`RayNodeLink`. What the Dask scheduler holds for a run (the control
variable, node 0's address, the started marks, the event topic, a pool's command topic) is held
by one small actor per run, the :class:`RunHub`, which the kernel creates and kills.

The hub is an asyncio actor with no CPU of its own: a node task's event batch is one
``put`` call, and the kernel's event thread and a pool node's command thread each wait in one
long call (``take``, ``commands_after``) that returns as soon as something arrives. Calls from
one caller run in the order made, so each node's batches, and the pool's commands, keep their
order.

Runs in a Ray worker process (the hub: in its own). Imports ray only when called.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from notebook_kit.node.probe import probe_report
from notebook_kit.node.protocol import Control, NodeOrder, NodeReport, ProbeReport, Rendezvous
from notebook_kit.node.task import serve_node

__all__ = ["RayNodeLink", "RunHub", "probe_ray_worker", "run_ray_node"]

_RPC_SECONDS = 2.0  # no hub call of a node task waits longer, but the first:
_HUB_START_SECONDS = 60.0  # the hub's process starts with the node tasks'
_COMMAND_WAIT_SECONDS = 0.5  # a pool node's command thread asks again this often
_SIGTERM_AGAIN_SECONDS = 1.0  # a held SIGTERM ends the worker this long after its node ended


class RunHub:
    """One run's shared state on a Ray cluster (made an actor by ``ray.remote``)."""

    def __init__(self, control: dict[str, Any]) -> None:
        self._control = control
        self._master: tuple[str, int] | None = None
        self._started: dict[int, str] = {}
        self._events: list[tuple[float, dict[str, Any]]] = []
        self._commands: list[bytes] = []
        self._arrived = asyncio.Event()
        self._commanded = asyncio.Event()

    def set_control(self, control: dict[str, Any]) -> None:
        self._control = control

    def control(self) -> dict[str, Any]:
        return self._control

    def claim(self, node: int, worker: str) -> bool:
        """Mark ``node`` started; False if it was already."""
        if node in self._started:
            return False
        self._started[node] = worker
        return True

    def publish_master(self, host: str, port: int) -> None:
        self._master = (host, port)

    def master(self) -> tuple[str, int] | None:
        return self._master

    def put(self, node: int, events: list[bytes]) -> None:
        self._events.append((time.time(), {"node": node, "events": events}))
        self._arrived.set()

    async def take(self, wait: float) -> list[tuple[float, dict[str, Any]]]:
        """Every batch that has arrived, waiting up to ``wait`` seconds for the first."""
        if not self._events:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), wait)
        taken, self._events = self._events, []
        self._arrived.clear()
        return taken

    def command(self, data: bytes) -> None:
        self._commands.append(data)
        self._commanded.set()
        self._commanded = asyncio.Event()  # the waiters of this one are woken; later ones wait

    async def commands_after(self, seen: int, wait: float) -> list[bytes]:
        """The commands after the first ``seen``, waiting up to ``wait`` seconds for one."""
        if len(self._commands) <= seen:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._commanded.wait(), wait)
        return self._commands[seen:]


class RayNodeLink:
    """A node task's link on a Ray cluster: calls to its run's :class:`RunHub`."""

    def __init__(self, hub: Any, node_rank: int, worker: str) -> None:
        self._hub, self._node, self.worker = hub, node_rank, worker
        self._listening = threading.Event()

    def _call(self, method: Any, *args: Any, wait: float = _RPC_SECONDS) -> Any:
        import ray

        return ray.get(method.remote(*args), timeout=wait)

    def claim(self) -> bool:
        """The node task's first call: the hub's process may still be starting."""
        claimed = self._call(self._hub.claim, self._node, self.worker, wait=_HUB_START_SECONDS)
        return bool(claimed)

    def control(self) -> Control:
        return Control.read(self._call(self._hub.control))

    def master(self) -> Rendezvous | None:
        published = self._call(self._hub.master)
        return Rendezvous(str(published[0]), int(published[1])) if published else None

    def publish_master(self, master: Rendezvous) -> None:
        self._call(self._hub.publish_master, master.host, master.port)

    def send(self, node: int, events: list[bytes]) -> None:
        self._hub.put.remote(node, events)  # not waited for: the relay never blocks on it

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
                    _SIGTERM_AGAIN_SECONDS, os.kill, (os.getpid(), signal.SIGTERM)
                )
                again.daemon = True
                again.start()

        return release


def run_ray_node(order: NodeOrder, hub: Any, worker: str) -> NodeReport:
    """The Ray task of one node: run it, relay it, and report how it ended."""
    return serve_node(order, RayNodeLink(hub, order.node_rank, worker))


def probe_ray_worker(
    payload: bytes, node0_host: str, worker: str, host: str, gpus: int
) -> ProbeReport:
    """Run on the Ray node of ``worker``: describe it and try to rebuild the function.

    ``gpus`` are the Ray node's GPU resources (this task, holding none, sees none itself).
    """
    return probe_report(worker, host, payload, node0_host, gpus)
