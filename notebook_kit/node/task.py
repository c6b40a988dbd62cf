"""The node task: a Dask task that runs one node of a cluster run in a fresh process.

The task thread of the Dask worker starts ``python -m notebook_kit.launch.cluster.node_process``
(a fresh interpreter: forking the multithreaded Dask worker would copy locks held by its other
threads), hands it the order over a pipe, and then only relays: the node's events go to the
scheduler as one Dask event a few times a second, and the kernel's control variable (Stop,
abort, lease) goes to the node. The node process dies with this thread (``PR_SET_PDEATHSIG``),
so a Dask worker that dies takes its node with it; its guardian then stops the ranks.

A task whose worker died may be run again by Dask (``allowed-failures``). Each node marks
itself started on the scheduler first, so a second run of the same node refuses to train.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any

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
    Rendezvous,
    RunNames,
    decode,
    encode,
)

__all__ = ["node_environment", "run_node"]

_BATCH_SECONDS = 0.25  # events leave in one Dask event this often (and a heartbeat if idle)
_INTERRUPT_GRACE_SECONDS = 1.0  # after SIGINT, the node process gets this long, then SIGKILL
_RPC_SECONDS = 2.0  # no scheduler call of a watcher waits longer


class _Control(threading.Thread):
    """Reads the kernel's control variable in the background; a read never blocks the relay."""

    def __init__(
        self, client: Any, names: RunNames, lease_seconds: float, wants_master: bool
    ) -> None:
        super().__init__(name="notebook_kit-control", daemon=True)
        from distributed import Variable

        self._variable = Variable(names.control, client=client)
        self._address = Variable(names.address, client=client) if wants_master else None
        self.master: Rendezvous | None = None
        self._lease_seconds = lease_seconds
        self._lease = -1
        self._renewed = time.monotonic()
        self.stop_requested = False
        self.abort = ""
        self.finished = threading.Event()

    def run(self) -> None:
        while not self.finished.is_set():
            with contextlib.suppress(Exception):  # unreachable scheduler: the lease ages
                self._read_control()
                if self._address is not None and self.master is None:
                    self._read_master()
            waiting = self._address is not None and self.master is None
            self.finished.wait(CONTROL_PERIOD_SECONDS / (5 if waiting else 2))

    def _read_control(self) -> None:
        control = Control.read(self._variable.get(callback_timeout=_RPC_SECONDS))
        if control.lease != self._lease:
            self._lease, self._renewed = control.lease, time.monotonic()
        self.stop_requested = self.stop_requested or control.stop
        self.abort = self.abort or control.abort

    def _read_master(self) -> None:
        """Node 0's rendezvous address, once it has published it (empty until then)."""
        assert self._address is not None
        published = self._address.get(callback_timeout=_RPC_SECONDS)
        if published:
            self.master = Rendezvous(str(published[0]), int(published[1]))

    @property
    def lease_expired(self) -> bool:
        return time.monotonic() - self._renewed > self._lease_seconds

    def ending(self) -> str:
        """Why the node must end now ("" while it may go on)."""
        if self.abort:
            return "abort"
        return "lease" if self.lease_expired else ""


def run_node(order: NodeOrder) -> NodeReport:
    """The Dask task of one node: run it, relay it, and report how it ended."""
    from distributed import Variable, get_client, get_worker

    worker, client = get_worker(), get_client()
    names = RunNames(order.run_id)
    started = Variable(names.started(order.node_rank), client=client)
    if started.get(callback_timeout=_RPC_SECONDS):  # the kernel set it empty before submitting
        return NodeReport(order.node_rank, worker.address, ended_by="refused")
    started.set(worker.address)
    control = _Control(client, names, order.lease_seconds, wants_master=order.node_rank != 0)
    control.start()
    relay = _Relay(order, names, control, worker, client)
    if order.pool:  # a pool's commands: every node hears each one, in the order sent
        client.subscribe_topic(names.commands, relay.commanded)
    try:
        return relay.run()
    finally:
        control.finished.set()
        if order.pool:
            with contextlib.suppress(Exception):
                client.unsubscribe_topic(names.commands)


class _Relay:
    """Starts the node process and passes messages both ways until it has ended."""

    def __init__(
        self, order: NodeOrder, names: RunNames, control: _Control, worker: Any, client: Any
    ) -> None:
        self.order, self.names = order, names
        self.master_sent = order.node_rank == 0  # node 0 binds the rendezvous itself
        self.control, self.worker, self.client = control, worker, client
        self.batch: list[bytes] = []
        self.outcome: bytes | None = None
        self.ended_by = ""
        self.stop_sent = False
        self.interrupted_at: float | None = None
        self.urgent = False  # an event the kernel waits for is in the batch: send it now
        self.commands: collections.deque[bytes] = collections.deque()
        # Readable once a command has arrived: the relay's wait ends for it at once.
        self.wake, self._ring = socket.socketpair()
        self.wake.setblocking(False)
        self._ring.setblocking(False)

    def commanded(self, event: tuple[float, Any]) -> None:
        """On the worker's client thread: a pool command for the node process, in order."""
        self.commands.append(bytes(event[1]))
        with contextlib.suppress(OSError):  # full (it is awake anyway) or closed (ended)
            self._ring.send(b"!")

    def run(self) -> NodeReport:
        orders_read, orders = multiprocessing.Pipe(duplex=False)
        events, events_write = multiprocessing.Pipe(duplex=False)
        fds = (orders_read.fileno(), events_write.fileno())
        process = subprocess.Popen(
            [sys.executable, "-m", "notebook_kit.launch.cluster.node_process", *map(str, fds)],
            pass_fds=fds,
            env=node_environment(self.order.interface),
            stdin=subprocess.DEVNULL,
        )
        orders_read.close()
        events_write.close()
        try:
            orders.send_bytes(encode(self.order))
            self._relay(process, events, orders)
        finally:
            if process.poll() is None:  # only if the relay itself failed
                process.kill()
            process.wait()
            orders.close()
            events.close()
            self.wake.close()
            self._ring.close()
        self._send_batch()
        return NodeReport(
            self.order.node_rank,
            self.worker.address,
            outcome=self.outcome,
            ended_by=self.ended_by,
            exit_code=process.returncode,
        )

    def _relay(self, process: subprocess.Popen, events: Any, orders: Any) -> None:
        last_sent = time.monotonic()
        open_pipe = True
        while open_pipe or process.poll() is None:
            if open_pipe:
                open_pipe = self._read(events)
            else:
                time.sleep(0.05)
            self._obey(process, orders)
            if self.urgent or time.monotonic() - last_sent >= _BATCH_SECONDS:
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
            from distributed import Variable

            master = decode(data, Rendezvous)
            Variable(self.names.address, client=self.client).set([master.host, master.port])
        elif tag == OUTCOME:
            self.outcome = data
        else:
            self.batch.append(data)
            self.urgent = self.urgent or tag == URGENT

    def _obey(self, process: subprocess.Popen, orders: Any) -> None:
        if not self.master_sent and self.control.master is not None:
            self.master_sent = True
            with contextlib.suppress(OSError):
                orders.send_bytes(encode(self.control.master))
        if self.control.stop_requested and self.master_sent and not self.stop_sent:
            self.stop_sent = True
            with contextlib.suppress(OSError):
                orders.send_bytes(encode(LaunchStop()))
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
        """One Dask event with everything since the last (an empty one is the heartbeat)."""
        message = {"node": self.order.node_rank, "events": self.batch}
        self.batch, self.urgent = [], False
        with contextlib.suppress(Exception):
            self.worker.log_event(self.names.events, message)


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
    """What Dask's nanny put in the worker's environment before starting it."""
    try:
        import dask

        presets = dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}
    except Exception:
        return {}
    return {str(name): str(value) for name, value in presets.items() if value is not None}
