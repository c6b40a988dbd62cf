"""Worker side of the Dask engine, run in a Dask worker: the node task and the probe task."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from notebook_kit.node.probe import host_of, probe_report
from notebook_kit.node.protocol import (
    Control,
    NodeOrder,
    NodeReport,
    ProbeReport,
    Rendezvous,
    RunNames,
    read_control,
)
from notebook_kit.node.task import SIGTERM_AGAIN_SECONDS, serve_node
from notebook_kit.node.zygote import local_zygote

__all__ = ["DaskNodeLink", "probe_worker", "run_node"]

_RPC_SECONDS = 2.0  # no scheduler call of a watcher waits longer


def run_node(order: NodeOrder, secret_key: str) -> NodeReport:
    """The Dask task of one node: run it, relay it, and report how it ended.

    The run's secret is in this worker's memory under ``secret_key``: the kernel scattered it
    here directly, and the scheduler holds its key, never its bytes. It is read here rather
    than made the task's dependency, which Dask would cancel the moment the worker died, before
    the kernel sees the worker leave.
    """
    from distributed import get_worker

    secret = get_worker().data[secret_key]
    return serve_node(order, DaskNodeLink(RunNames(order.run_id), order.node_rank), secret)


def probe_worker(payload: bytes, node0_host: str) -> ProbeReport:
    """Run on a Dask worker: describe it and try to rebuild the function."""
    from distributed import get_worker

    address = get_worker().address
    return probe_report(address, host_of(address), payload, node0_host)


class DaskNodeLink:
    """A node task's link on a Dask cluster: variables, topics and events of the scheduler."""

    def __init__(self, names: RunNames, node_rank: int) -> None:
        from distributed import Variable, get_client, get_worker

        self._worker, self._client = get_worker(), get_client()
        self.worker = self._worker.address
        self._names, self._node = names, node_rank
        self._control = Variable(names.control, client=self._client)
        self._address = Variable(names.address, client=self._client)
        self._listening = False

    def claim(self) -> bool:
        from distributed import Variable

        started = Variable(self._names.started(self._node), client=self._client)
        if started.get(callback_timeout=_RPC_SECONDS):  # the kernel set it empty at the start
            return False
        started.set(self.worker)
        return True

    def control(self, patience: float = 0.0) -> Control:
        """At once: a Dask variable cannot be waited on for a change."""
        return read_control(self._control.get(callback_timeout=_RPC_SECONDS))

    def master(self) -> Rendezvous | None:
        published = self._address.get(callback_timeout=_RPC_SECONDS)
        return Rendezvous(str(published[0]), int(published[1])) if published else None

    def publish_master(self, master: Rendezvous) -> None:
        self._address.set([master.host, master.port])

    def send(self, node: int, events: list[bytes]) -> None:
        self._worker.log_event(self._names.events, {"node": node, "events": events})

    def listen(self, commanded: Callable[[bytes], None]) -> None:
        self._listening = True
        self._client.subscribe_topic(self._names.commands, lambda event: commanded(event[1]))

    def close(self) -> None:
        if self._listening:
            with contextlib.suppress(Exception):
                self._client.unsubscribe_topic(self._names.commands)

    def zygote(self, env: dict[str, str]) -> str:
        """The worker process's own zygote: it lives as long as the worker."""
        return local_zygote(env).path

    def hold_sigterm(self, forward: Callable[[], None]) -> Callable[[], None]:
        """A Dask worker process told SIGTERM (Kubernetes deleting its pod, a VM shutting
        down) dies at once, and its node with it. Its event loop, on the process's main
        thread, takes the signal instead while the node runs: the node's ranks save first."""
        loop = getattr(self._worker.loop, "asyncio_loop", None)
        if loop is None:
            return lambda: None
        received = threading.Event()

        def on_sigterm() -> None:
            received.set()
            forward()

        def hold() -> Any:
            previous = signal.getsignal(signal.SIGTERM)
            loop.add_signal_handler(signal.SIGTERM, on_sigterm)  # main thread only
            return previous

        held = _on_loop(loop, hold)
        if held is _FAILED:  # a worker without a main-thread loop (processes=False): no hold
            return lambda: None

        def release() -> None:
            def restore() -> None:
                loop.remove_signal_handler(signal.SIGTERM)
                signal.signal(signal.SIGTERM, held)
                if received.is_set():  # once the report is out: end as the signal asked
                    loop.call_later(SIGTERM_AGAIN_SECONDS, os.kill, os.getpid(), signal.SIGTERM)

            _on_loop(loop, restore)

        return release


_FAILED = object()


def _on_loop(loop: Any, call: Callable[[], Any]) -> Any:
    """``call()`` on ``loop``'s thread, waited for; ``_FAILED`` if it raised or timed out."""
    done: dict[str, Any] = {}
    finished = threading.Event()

    def run() -> None:
        try:
            done["value"] = call()
        except Exception:
            done["value"] = _FAILED
        finished.set()

    loop.call_soon_threadsafe(run)
    return done.get("value", _FAILED) if finished.wait(_RPC_SECONDS) else _FAILED
