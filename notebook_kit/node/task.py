"""The node task: runs one node of a cluster run in its own process, on any engine.

The task thread of the engine's worker has its node process forked by the worker's zygote
(:mod:`notebook_kit.node.zygote`: a fresh interpreter that imported torch once, as forking the
multithreaded worker itself would copy locks held by its other threads), hands it the order
over a pipe, and then only relays: the node's events go to the kernel in one batch a few
times a second, and the kernel's control value (Stop, abort, lease) and commands (a pool's, a
line typed at a rank's pdb prompt) go to the node. The node
process dies with this task's process, so a worker that dies takes its node with it; its
guardian then stops the ranks.

A task whose worker died may be run again by the engine. Each node marks itself started
first, so a second run of the same node refuses to train.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any, Protocol

from notebook_kit.node.probe import node_environment
from notebook_kit.node.protocol import (
    ADDRESS,
    CONTROL_PERIOD_SECONDS,
    OUTCOME,
    URGENT,
    Control,
    LaunchStop,
    NodeOrder,
    NodeReport,
    ProfileAsk,
    ProtocolError,
    Rendezvous,
    Seal,
    StacksAsk,
    decode,
    encode,
)
from notebook_kit.node.zygote import ZygoteChild

__all__ = [
    "NODE_PROCESS_MAIN",
    "NODE_PROCESS_NAME",
    "SIGTERM_AGAIN_SECONDS",
    "NodeLink",
    "serve_node",
]

NODE_PROCESS_NAME = "nk-node"  # a node process's name (/proc/PID/comm)
# What the zygote runs as the node process, by name: benchmarks.scale puts a simulated node
# (ranks as threads, no torch) here in its workers, so all from this relay on is the real code.
NODE_PROCESS_MAIN = "notebook_kit.launch.node_process.process:main"

_BATCH_SECONDS = 0.25  # events leave in one batch this often
_HEARTBEAT_SECONDS = 1.0  # an empty batch leaves this often when the node has nothing to say
_CONTROL_PATIENCE_SECONDS = 1.0  # a control read waits this long for a change, where it can
_INTERRUPT_GRACE_SECONDS = 1.0  # after SIGINT, the node process gets this long, then SIGKILL
SIGTERM_AGAIN_SECONDS = 1.0  # a held SIGTERM ends the worker this long after its node ended
_log = logging.getLogger(__name__)


class NodeLink(Protocol):
    """The node task's side of a cluster engine: all it asks of the cluster.

    Each engine has one, in :mod:`notebook_kit.node.links`; the kernel's side is
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
        self.stacks = StacksAsk(0, 0.0)  # the kernel's latest stacks() request
        self.profile: ProfileAsk | None = None  # and its latest profile() request
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
        if control.stacks > self.stacks.number:
            self.stacks = StacksAsk(control.stacks, control.stacks_seconds)
        if control.profile is not None:
            self.profile = control.profile

    def ending(self) -> str:
        """Why the node must end now ("" while it may go on)."""
        if self.abort:
            return "abort"
        return "lease" if time.monotonic() - self._renewed > self._lease_seconds else ""


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
    # A pool's commands, and a launch's or a pool's lines typed at a rank's pdb prompt: every
    # node hears each one, in the order sent, pushed (a control value would wait to be read).
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
        self.stacks_sent = 0  # the latest stacks() request passed on to the node process
        self.profile_sent: ProfileAsk | None = None  # and the latest profile() request
        self.interrupted_at: float | None = None
        self.urgent = False  # an event the kernel waits for is in the batch: send it now
        self.forged = False  # a command that was not the kernel's came (and was dropped)
        self.commands: collections.deque[bytes] = collections.deque()
        # Readable once a command has arrived: the relay's wait ends for it at once.
        self.wake, self._ring = socket.socketpair()
        self.wake.setblocking(False)
        self._ring.setblocking(False)

    def commanded(self, command: bytes) -> None:
        """On the engine's thread: a command for the node process, in order; one the
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
                NODE_PROCESS_MAIN,
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
        release = self.link.hold_sigterm(lambda: process.send_signal(signal.SIGTERM))
        try:
            orders.send_bytes(self.seal.secret)  # a private pipe: the run's secret, then
            orders.send_bytes(encode(self.order, self.seal))  # the order it seals
            self._relay(process, events, orders)
        finally:
            if process.poll() is None:  # only if the relay itself failed
                process.kill()
            process.wait()
            release()
            self._close_ends()
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
        ask = self.control.stacks
        if ask.number > self.stacks_sent and self.master_sent:
            self.stacks_sent = ask.number
            with contextlib.suppress(OSError):
                orders.send_bytes(encode(ask, self.seal))
        profile = self.control.profile
        if profile is not None and profile != self.profile_sent and self.master_sent:
            self.profile_sent = profile  # a new request, or the same one cancelled
            with contextlib.suppress(OSError):
                orders.send_bytes(encode(profile, self.seal))
        while self.master_sent and self.commands:
            with contextlib.suppress(OSError):
                orders.send_bytes(self.commands.popleft())
        why = self.control.ending()
        if not why or process.poll() is not None:
            return
        if self.interrupted_at is None:
            self.ended_by, self.interrupted_at = why, time.monotonic()
            process.send_signal(signal.SIGINT)
        elif time.monotonic() - self.interrupted_at > _INTERRUPT_GRACE_SECONDS:
            process.kill()  # its guardian sees it die and stops the ranks

    def _send_batch(self) -> None:
        """Everything since the last batch, at once (an empty one is the heartbeat)."""
        batch, self.batch, self.urgent = self.batch, [], False
        with contextlib.suppress(Exception):
            self.link.send(self.order.node_rank, batch)
