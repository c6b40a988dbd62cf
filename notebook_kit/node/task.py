"""The node task: a Dask task that runs one node of a cluster run in its own process.

The task thread of the Dask worker has its node process forked by the worker's zygote
(:mod:`notebook_kit.node.zygote`: a fresh interpreter that imported torch once, as forking the
multithreaded Dask worker itself would copy locks held by its other threads), hands it the
order over a pipe, and then only relays: the node's events go to the scheduler as one Dask
event a few times a second, and the kernel's control variable (Stop, abort, lease) goes to the
node. The node process dies with this task's process, so a Dask worker that dies takes its node
with it; its guardian then stops the ranks.

A task whose worker died may be run again by Dask (``allowed-failures``). Each node marks
itself started on the scheduler first, so a second run of the same node refuses to train.

All it asks of the cluster goes through a :class:`NodeLink`: :func:`run_node` is the Dask task,
which serves its node through a :class:`DaskNodeLink`; another engine's task calls
:func:`serve_node` with its own link.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any, Protocol

from notebook_kit.node.probe import worker_python_path
from notebook_kit.node.protocol import (
    ADDRESS,
    CONTROL_PERIOD_SECONDS,
    OUTCOME,
    URGENT,
    Control,
    LaunchStop,
    NodeOrder,
    NodeReport,
    ProtocolError,
    Rendezvous,
    RunNames,
    Seal,
    decode,
    encode,
)
from notebook_kit.node.zygote import ZygoteChild, local_zygote

__all__ = [
    "NODE_PROCESS_NAME", "DaskNodeLink", "NodeLink", "node_environment", "run_node", "serve_node",
]  # fmt: skip

NODE_PROCESS_NAME = "nk-node"  # a node process's name (/proc/PID/comm)

_BATCH_SECONDS = 0.25  # events leave in one batch this often
_HEARTBEAT_SECONDS = 1.0  # an empty batch leaves this often when the node has nothing to say
_CONTROL_PATIENCE_SECONDS = 1.0  # a control read waits this long for a change, where it can
_INTERRUPT_GRACE_SECONDS = 1.0  # after SIGINT, the node process gets this long, then SIGKILL
_RPC_SECONDS = 2.0  # no scheduler call of a watcher waits longer
_log = logging.getLogger(__name__)


class NodeLink(Protocol):
    """The node task's side of a cluster engine: all it asks of the cluster.

    :class:`DaskNodeLink` is Dask's; the kernel's side is
    :class:`~notebook_kit.launch.cluster.engine.Engine`.
    """

    worker: str  # this worker's address, as the kernel names it

    def claim(self) -> bool:
        """Mark this node started; False if it was already (the engine ran the task again)."""

    def control(self, patience: float = 0.0) -> Control:
        """The kernel's control value (raises when the cluster cannot be reached). An engine
        that can wait for a change may take up to ``patience`` seconds while only the lease
        moves, and answers as soon as anything else does."""

    def master(self) -> Rendezvous | None:
        """Node 0's rendezvous address, once node 0 has published it."""

    def publish_master(self, master: Rendezvous) -> None:
        """Node 0: where every other node finds the rendezvous."""

    def send(self, node: int, events: list[bytes]) -> None:
        """One batch of encoded events to the kernel (an empty one is a heartbeat)."""

    def listen(self, commanded: Callable[[bytes], None]) -> None:
        """Call ``commanded`` with each encoded pool command, in order, from now on."""

    def close(self) -> None:
        """Stop listening; nothing of the link stays."""

    def zygote(self, env: dict[str, str]) -> str:
        """The socket of the zygote that forks this node's process (``env``: the one it starts
        with, if it must be started)."""

    def hold_sigterm(self, forward: Callable[[], None]) -> Callable[[], None]:
        """While the node runs, SIGTERM to the engine's worker process calls ``forward`` (to
        the node process) instead of ending the worker at once; the returned call ends the
        hold, and a SIGTERM that came meanwhile then ends the worker as it would have."""


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
        return Control.read(self._control.get(callback_timeout=_RPC_SECONDS))

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
                    loop.call_later(_SIGTERM_AGAIN_SECONDS, os.kill, os.getpid(), signal.SIGTERM)

            _on_loop(loop, restore)

        return release


_FAILED = object()
_SIGTERM_AGAIN_SECONDS = 1.0  # a held SIGTERM ends the worker this long after its node ended


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


class _Control(threading.Thread):
    """Reads the kernel's control value in the background; a read never blocks the relay."""

    def __init__(self, link: NodeLink, lease_seconds: float, wants_master: bool) -> None:
        super().__init__(name="notebook_kit-control", daemon=True)
        self._link = link
        self._wants_master = wants_master
        self.master: Rendezvous | None = None
        self._lease_seconds = lease_seconds
        self._lease = -1
        self._renewed = time.monotonic()
        self.stop_requested = False
        self.abort = ""
        self.finished = threading.Event()

    def run(self) -> None:
        while not self.finished.is_set():
            waiting = self._wants_master and self.master is None
            with contextlib.suppress(Exception):  # unreachable scheduler: the lease ages
                # While node 0's address is awaited, the control value must not hold it up.
                self._read_control(0.0 if waiting else _CONTROL_PATIENCE_SECONDS)
                if waiting:
                    self.master = self._link.master()
            self.finished.wait(CONTROL_PERIOD_SECONDS / (5 if waiting else 2))

    def _read_control(self, patience: float) -> None:
        control = self._link.control(patience)
        if control.lease != self._lease:
            self._lease, self._renewed = control.lease, time.monotonic()
        self.stop_requested = self.stop_requested or control.stop
        self.abort = self.abort or control.abort

    @property
    def lease_expired(self) -> bool:
        return time.monotonic() - self._renewed > self._lease_seconds

    def ending(self) -> str:
        """Why the node must end now ("" while it may go on)."""
        if self.abort:
            return "abort"
        return "lease" if self.lease_expired else ""


def _signal(process: ZygoteChild, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signum)


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


def serve_node(order: NodeOrder, link: NodeLink, secret: bytes) -> NodeReport:
    """One node, on any engine: start its node process, relay until it ends, report."""
    control = _Control(link, order.lease_seconds, wants_master=order.node_rank != 0)
    relay = _Relay(order, control, link, Seal(secret))
    relay.start()
    try:
        claimed = link.claim()
    except BaseException:
        relay.abandon()
        raise
    if not claimed:
        relay.abandon()
        return NodeReport(order.node_rank, link.worker, ended_by="refused")
    control.start()
    if order.pool:  # a pool's commands: every node hears each one, in the order sent
        link.listen(relay.commanded)
    try:
        return relay.run()
    finally:
        control.finished.set()
        link.close()


class _Relay:
    """Starts the node process and passes messages both ways until it has ended."""

    def __init__(self, order: NodeOrder, control: _Control, link: NodeLink, seal: Seal) -> None:
        self.order, self.seal = order, seal
        self.master_sent = order.node_rank == 0  # node 0 binds the rendezvous itself
        self.control, self.link = control, link
        self.batch: list[bytes] = []
        self.outcome: bytes | None = None
        self.ended_by = ""
        self.stop_sent = False
        self.interrupted_at: float | None = None
        self.urgent = False  # an event the kernel waits for is in the batch: send it now
        self.forged = False  # a command that was not the kernel's came (and was dropped)
        self.commands: collections.deque[bytes] = collections.deque()
        # Readable once a command has arrived: the relay's wait ends for it at once.
        self.wake, self._ring = socket.socketpair()
        self.wake.setblocking(False)
        self._ring.setblocking(False)

    def commanded(self, command: bytes) -> None:
        """On the engine's thread: a pool command for the node process, in order; one the
        kernel did not seal (anyone who reaches the scheduler can post there) is dropped."""
        try:
            self.seal.open(command)
        except ProtocolError as error:
            if not self.forged:
                self.forged = True
                _log.warning("notebook_kit: dropped a pool command not sealed by the kernel "
                             "of run %s (%s)", self.order.run_id, error)  # fmt: skip
            return
        self.commands.append(bytes(command))
        with contextlib.suppress(OSError):  # full (it is awake anyway) or closed (ended)
            self._ring.send(b"!")

    def start(self) -> None:
        """Start the node process; it waits for its order on the orders pipe."""
        orders_read, self.orders = multiprocessing.Pipe(duplex=False)
        self.events, events_write = multiprocessing.Pipe(duplex=False)
        env = node_environment(self.order.interface)
        try:
            self.process = ZygoteChild(
                self.link.zygote(env),
                "notebook_kit.launch.node_process.process:main",
                [orders_read.fileno(), events_write.fileno()],
                env,
                name=NODE_PROCESS_NAME,
            )
        except BaseException:
            self._close_ends()
            raise
        finally:
            orders_read.close()
            events_write.close()

    def abandon(self) -> None:
        """End the node process before it was given its order (the node was refused)."""
        self.process.kill()
        self.process.wait()
        self._close_ends()

    def _close_ends(self) -> None:
        for end in (self.orders, self.events, self.wake, self._ring):
            end.close()

    def run(self) -> NodeReport:
        """Give the started node process its order, relay until it has ended, report."""
        process, orders, events = self.process, self.orders, self.events
        release = self.link.hold_sigterm(lambda: _signal(process, signal.SIGTERM))
        try:
            orders.send_bytes(self.seal.secret)  # a private pipe: the run's secret, then
            orders.send_bytes(encode(self.order, self.seal))  # the order it seals
            self._relay(process, events, orders)
        finally:
            if process.poll() is None:  # only if the relay itself failed
                process.kill()
            process.wait()
            release()
            orders.close()
            events.close()
            self.wake.close()
            self._ring.close()
        self._send_batch()
        return NodeReport(
            self.order.node_rank,
            self.link.worker,
            outcome=self.outcome,
            ended_by=self.ended_by,
            exit_code=process.returncode,
        )

    def _relay(self, process: ZygoteChild, events: Any, orders: Any) -> None:
        last_sent = time.monotonic()
        open_pipe = True
        while open_pipe or process.poll() is None:
            if open_pipe:
                open_pipe = self._read(events)
            else:
                time.sleep(0.05)
            self._obey(process, orders)
            since = time.monotonic() - last_sent
            if self.urgent or since >= (_BATCH_SECONDS if self.batch else _HEARTBEAT_SECONDS):
                self._send_batch()
                last_sent = time.monotonic()

    def _read(self, events: Any) -> bool:
        """Take what the node sent, waiting until it sends, a command arrives, or the batch is
        due; False once the node's end of the pipe is closed."""
        try:
            if events not in wait([events, self.wake], _BATCH_SECONDS):
                with contextlib.suppress(OSError):
                    while self.wake.recv(4096):
                        pass
                return True
            while True:
                data = events.recv_bytes()
                self._take(data)
                if not events.poll(0):
                    return True
        except (EOFError, OSError):
            return False

    def _take(self, frame: bytes) -> None:
        """Route one frame by its tag; events go on to the kernel still pickled."""
        tag, data = frame[:1], frame[1:]
        if tag == ADDRESS:
            self.link.publish_master(decode(data, Rendezvous, seal=self.seal))
        elif tag == OUTCOME:
            self.outcome = data
        else:
            self.batch.append(data)
            self.urgent = self.urgent or tag == URGENT

    def _obey(self, process: ZygoteChild, orders: Any) -> None:
        if not self.master_sent and self.control.master is not None:
            self.master_sent = True
            with contextlib.suppress(OSError):
                orders.send_bytes(encode(self.control.master, self.seal))
        if self.control.stop_requested and self.master_sent and not self.stop_sent:
            self.stop_sent = True
            with contextlib.suppress(OSError):
                orders.send_bytes(encode(LaunchStop(), self.seal))
        while self.master_sent and self.commands:
            with contextlib.suppress(OSError):
                orders.send_bytes(self.commands.popleft())
        why = self.control.ending()
        if not why or process.poll() is not None:
            return
        if self.interrupted_at is None:
            self.ended_by, self.interrupted_at = why, time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
        elif time.monotonic() - self.interrupted_at > _INTERRUPT_GRACE_SECONDS:
            process.kill()  # its guardian sees it die and stops the ranks

    def _send_batch(self) -> None:
        """Everything since the last batch, at once (an empty one is the heartbeat)."""
        batch, self.batch, self.urgent = self.batch, [], False
        with contextlib.suppress(Exception):
            self.link.send(self.order.node_rank, batch)


def node_environment(interface: str | None) -> dict[str, str]:
    """The worker's environment, less what Dask's nanny tuned for its own worker process, plus
    the interface gloo and NCCL must use to reach node 0, and a ``PYTHONPATH`` that gives the
    node process the worker's own folders (its local directory, where ``client.upload_file``
    and ``UploadDirectory`` put files, and those it was started with).

    The nanny sets ``distributed.nanny.pre-spawn-environ`` in its environment before it starts
    the worker: one-thread BLAS and OpenMP pools, and ``MALLOC_TRIM_THRESHOLD_=65536``, which
    makes glibc hand freed memory back at once and serve every large block with a fresh
    ``mmap``. A training process that frees and allocates its activations every step then
    faults in each of their pages again: about five times the page faults of a process started
    without it, and nearly twice the CPU time per step of a small CNN. The node process starts
    as a local launch's ranks do, without them; the ranks size their thread pools themselves.
    """
    env = dict(os.environ)
    for name, value in _nanny_presets().items():
        if env.get(name) == value:
            del env[name]
    if interface:
        env["GLOO_SOCKET_IFNAME"] = interface
        env["NCCL_SOCKET_IFNAME"] = interface
    env["PYTHONPATH"] = worker_python_path(env.get("PYTHONPATH"))
    return env


def _nanny_presets() -> dict[str, str]:
    """What Dask's nanny puts in the environment of the worker it starts.

    A ``LocalCluster`` runs its nannies in the calling process and sets them in that process's
    own environment too, so a Ray instance the kernel starts afterwards, and its workers, have
    them. A Ray worker has not imported ``distributed``, whose defaults file declares them:
    they are read from that file.
    """
    try:
        import dask

        presets = dask.config.get("distributed.nanny.pre-spawn-environ", default=None)
        if presets is None:
            presets = _distributed_defaults()["distributed"]["nanny"]["pre-spawn-environ"]
    except Exception:  # no dask, or no distributed: no nanny put anything here
        return {}
    return {str(name): str(value) for name, value in (presets or {}).items() if value is not None}


def _distributed_defaults() -> dict[str, Any]:
    """``distributed``'s defaults file, read without importing ``distributed``."""
    import importlib.util
    from pathlib import Path

    import yaml

    spec = importlib.util.find_spec("distributed")
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("distributed is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    return yaml.safe_load((folder / "distributed.yaml").read_text())
