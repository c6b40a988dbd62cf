"""One attempt of a cluster run: submit a node task per node, watch them, end them together.

The kernel never waits on a single node. Its loop drains the events the node tasks send
through the cluster's :class:`~notebook_kit.launch.cluster.engine.Engine`, ticks the view,
renews its lease, and checks that every node is still there: a node is lost when its worker
leaves the cluster, or when no event (not even the heartbeat a quiet node task sends each
second) has come from it for ``NODE_SILENCE_SECONDS``. Any failure or loss sets ``abort`` on
the control value, which every node task reads within a fraction of a second and turns into
Ctrl-C for its node.

The kernel's loop never blocks here: the events arrive on the engine's thread, which queues
them and writes a byte to ``wake``, a socket the launcher's steps yield to wait on. Only a
rank's pdb prompt holds it, as on one machine: the loop asks it in the cell (one rank at a
time, :class:`~notebook_kit.launch.debugger_desk.DebuggerDesk`) and sends the line typed to the
nodes as a sealed command; the lease thread renews meanwhile, and the time spent there counts
against no timeout (``debugged``).

Whoever can reach the cluster can post on the run's event topic too. Every frame a node sends
is sealed with the attempt's secret (:mod:`notebook_kit.runtime.codec`), which only the kernel
and the run's node tasks hold: a batch that is not the nodes' is dropped, with one warning per
attempt, and the run goes on.
"""

from __future__ import annotations

import contextlib
import queue
import secrets
import socket
import threading
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from notebook_kit.errors import WorkerFailure
from notebook_kit.launch.cluster.cluster_stacks import ClusterStackDesk
from notebook_kit.launch.cluster.engine import Engine, NodeTask
from notebook_kit.launch.cluster.failures import node_lost, on_kernel_clock
from notebook_kit.launch.debugger_desk import DebuggerDesk
from notebook_kit.launch.stall_watch import naming_ranks_in_pdb
from notebook_kit.live.observer import LaunchObserver
from notebook_kit.node.protocol import (
    CONTROL_PERIOD_SECONDS,
    NODE_EVENTS,
    NODE_OUTCOMES,
    Control,
    DebuggerAnswer,
    NodeAnswer,
    NodeCommand,
    NodeError,
    NodeEvent,
    NodeFailed,
    NodeFinished,
    NodeOrder,
    NodePrint,
    NodeProfiles,
    NodeReady,
    NodeReport,
    NodeSettings,
    NodeStacks,
    NodeValue,
    ProbeReport,
    ProfileAsk,
    ProtocolError,
    RunNames,
    Seal,
    control_frame,
    decode,
    encode,
)
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import (
    DebuggerLeft,
    DebuggerLine,
    DebuggerPrompt,
    MetricsBatch,
    OutputLine,
)

__all__ = [
    "END_GRACE_SECONDS",
    "NODE_SILENCE_SECONDS",
    "AttemptResult",
    "ClusterAttempt",
    "nodes_per_host",
]

NODE_SILENCE_SECONDS = 15.0  # no event from a node this long: it is lost
_WORKER_CHECK_SECONDS = 0.5  # how often the scheduler's worker list is read
END_GRACE_SECONDS = 8.0  # after an abort, the nodes get this long to report


@dataclass
class AttemptResult:
    """How an attempt ended."""

    value: Any = None
    weights: dict[int, Any] = field(default_factory=dict)
    failures: list[WorkerFailure] = field(default_factory=list)
    lost_nodes: tuple[int, ...] = ()
    timed_out: bool = False
    stopped: bool = False


class ClusterAttempt:
    """Start the nodes, run the kernel's loop until every node has ended, clean up."""

    def __init__(
        self,
        engine: Engine,
        reports: list[ProbeReport],
        payload: bytes,
        settings: NodeSettings,
        observer: LaunchObserver,
        stop_flag: StopFlag,
        pool: bool = False,
        restart_count: int = 0,
    ) -> None:
        self.engine, self.reports, self.payload = engine, reports, payload
        self.restart_count = restart_count  # restarts of every node before this attempt
        self.pool = pool  # the nodes keep their ranks and serve commands (a cluster pool)
        self.ready: dict[int, tuple[int, ...]] = {}  # a pool's nodes: their ranks' pids
        self.answers: dict[int, NodeAnswer] = {}  # a pool's nodes: the last answer of each
        self.settings, self.observer, self.stop_flag = settings, observer, stop_flag
        self.names = RunNames(uuid.uuid4().hex)
        self.seal = Seal.new()  # the nodes' frames are sealed with it: nobody else's are
        self.forged = 0  # batches or frames dropped as not the nodes' (one warning for all)
        self.events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.tasks: list[NodeTask] = []
        self.heard = [time.monotonic()] * len(reports)
        self.ended: dict[int, NodeReport] = {}
        self.result = AttemptResult()
        self.abort = ""
        self.failed_nodes: set[int] = set()
        self.stacks = ClusterStackDesk()  # stacks() asks here (a pool: during each command)
        self._stacks_asked = (0, 0.0)  # the latest request's number and a node's seconds
        self._profile_asked: ProfileAsk | None = None  # the latest profile() request
        self.debugger = DebuggerDesk()  # the nodes' ranks' pdb prompts, asked in the cell
        self.debugged = 0.0  # seconds spent at those prompts: nobody's timeout
        self._lease = 0
        self._lease_done = threading.Event()
        self._lease_thread = threading.Thread(target=self._renew, daemon=True)
        self.wake, self._ring = socket.socketpair()  # readable once an event has arrived
        self.wake.setblocking(False)
        self._ring.setblocking(False)

    @property
    def num_nodes(self) -> int:
        return len(self.reports)

    @property
    def world_size(self) -> int:
        return self.settings.num_processes * self.num_nodes

    def where(self) -> str:
        """``2 processes on each of 2 Dask workers (tcp://..., tcp://...), world size 4``."""
        processes = self.settings.num_processes
        return (
            f"{processes} process{'es' if processes > 1 else ''} on each of {self.num_nodes} "
            f"{self.engine.worker_noun}s ({', '.join(r.worker for r in self.reports)}), "
            f"world size {self.world_size}"
        )

    def rank_nodes(self) -> tuple[int, ...]:
        """The node of each global rank."""
        return tuple(rank // self.settings.num_processes for rank in range(self.world_size))

    def start(self) -> None:
        """Publish the control variable, subscribe to the events, submit every node task."""
        self._publish()
        self.engine.open_run(self.names, self.num_nodes, self._arrived)
        prefix = f"notebook_kit/{secrets.token_hex(16)}/"
        sharing = nodes_per_host(self.reports)
        for node, report in enumerate(self.reports):
            order = NodeOrder(
                run_id=self.names.run_id,
                node_rank=node,
                num_nodes=self.num_nodes,
                host=report.local_address or report.host,
                interface=report.interface,
                payload=self.payload,
                settings=self.settings,
                store_prefix=prefix,
                host_nodes=sharing[node],
                pool=self.pool,
                restart_count=self.restart_count,
            )
            self.tasks.append(self.engine.submit(order, report.worker, self.seal.secret))
        self.heard = [time.monotonic()] * self.num_nodes
        self._lease_thread.start()
        if not self.pool:
            self.stacks.open(self.step)

    def step(self, timeout: float) -> bool:
        """One turn of the kernel's loop; False once every node has ended.

        It shows every event that has arrived, waiting up to ``timeout`` for the first (0:
        only what is there, as when the launcher's steps have waited on ``wake`` already).
        """
        with self.stacks.turn():
            self.stacks.take(self)
            running = self._step(timeout)
        if running and not self.abort:
            self.debugged += self.debugger.turn(self._answer_debugger)
        return running

    def _answer_debugger(self, rank: int, line: DebuggerLine) -> None:
        """The line typed at ``rank``'s prompt, to every node (the one holding it writes it):
        on the command topic, pushed and sealed, as a pool's commands."""
        self.engine.command(self.names, encode(DebuggerAnswer(rank, line), self.seal))

    def ask_profile(self, ask: ProfileAsk) -> None:
        """Publish a profile() request (or its cancellation: no steps) for every node."""
        self._profile_asked = ask
        self._publish()

    def ask_stacks(self, seconds: float) -> int:
        """Publish a new stacks() request, ``seconds`` for each node; its number."""
        self._stacks_asked = (self._stacks_asked[0] + 1, seconds)
        self._publish()
        return self._stacks_asked[0]

    def _step(self, timeout: float) -> bool:
        with contextlib.suppress(OSError):
            while self.wake.recv(4096):
                pass
        wait = timeout
        while True:
            try:
                event = self.events.get(timeout=wait) if wait > 0 else self.events.get_nowait()
            except queue.Empty:
                break
            self._deliver(event)
            wait = 0.0  # then only what has arrived with it
        self.observer.on_tick()
        if self.stop_flag.is_set() and not self.result.stopped:
            self.result.stopped = True
            self._publish()
        self._collect_ended()
        self._check_nodes()
        return len(self.ended) + len(self.result.lost_nodes) < self.num_nodes

    def command(self, order: NodeCommand) -> None:
        """A pool's order to every node (each node relays it to its node process, in order)."""
        self.engine.command(self.names, encode(order, self.seal))

    def end_all(self, why: str) -> None:
        """Ask every node to end now (Ctrl-C for each node's launcher)."""
        if not self.abort:
            self.abort = why
            self._publish()

    def finish(self, grace: float = END_GRACE_SECONDS) -> None:
        """Wait (bounded) for the nodes still running to report, then release everything."""
        deadline = time.monotonic() + grace
        try:
            while time.monotonic() < deadline and self.step(0.05):
                pass
        finally:
            self._release()

    # -- events from the nodes ------------------------------------------------------------

    def _arrived(self, event: tuple[float, dict[str, Any]]) -> None:
        """On the engine's thread: queue the event, wake the kernel's loop."""
        self.events.put(event)
        with contextlib.suppress(OSError):  # full (it is awake anyway) or closed (ended)
            self._ring.send(b"!")

    def _deliver(self, event: Any) -> None:
        """Show one batch; one that is not the nodes' (forged, damaged) is dropped."""
        try:
            node, frames = _batch(event, self.num_nodes)
            decoded = [decode(data, *NODE_EVENTS, seal=self.seal) for data in frames]
        except ProtocolError as error:
            self._forgery(error)
            return
        self.heard[node] = time.monotonic()
        for message in decoded:
            self._show(message)

    def _forgery(self, error: ProtocolError) -> None:
        """One warning per attempt: the run goes on without what was dropped."""
        self.forged += 1
        if self.forged > 1:
            return
        dropped = (
            f"Dropped a message on {self.names.events} that this run's nodes did not send "
            f"({error}): someone who can reach the cluster posted it, or it was damaged. "
            f"It was not read, and the run goes on; docs/cluster.md says who can post "
            f"there and how to close the cluster to others (TLS)."
        )
        warnings.warn(dropped, RuntimeWarning, stacklevel=2)

    def _show(self, event: NodeEvent) -> None:
        if isinstance(event, OutputLine):
            self.observer.on_output(event.rank, event.stream, event.text)
        elif isinstance(event, MetricsBatch):
            self.observer.on_metrics(event)
        elif isinstance(event, NodePrint):  # what a node's launcher printed (a stall report)
            print(naming_ranks_in_pdb(event.text, self.debugger.ranks()), flush=True)
        elif isinstance(event, NodeReady):
            self.ready[event.node] = event.pids
        elif isinstance(event, NodeAnswer):
            self.answers[event.node] = event
        elif isinstance(event, NodeStacks):
            self.stacks.on_stacks(event)
        elif isinstance(event, NodeProfiles):
            self.stacks.on_node_profiles(event)
        elif isinstance(event, (DebuggerPrompt, DebuggerLeft)):  # a rank's pdb, on its node
            self.debugger.receive(event)
        elif isinstance(event, NodeFinished):
            # A node asked to stop (SIGTERM: preempted) stops the run as the Stop button does.
            self.result.stopped = self.result.stopped or event.stopped
            if event.failures:  # a node's ranks failed: end the others before its task returns
                self._node_failed(event.node, event.failures)

    def _node_failed(self, node: int, failures: tuple[WorkerFailure, ...]) -> None:
        """Record a node's failures once (its event and its outcome both carry them)."""
        if node not in self.failed_nodes:
            self.failed_nodes.add(node)
            self.result.failures += on_kernel_clock(failures, time.monotonic())
        self.end_all(f"node {node} failed")

    def _collect_ended(self) -> None:
        ended = []  # their reports are fetched together
        for node, task in enumerate(self.tasks):
            if node in self.ended or node in self.result.lost_nodes or not task.done():
                continue
            failure = task.failure()
            if failure is not None:
                self._lose(node, failure)
            else:
                ended.append(node)
        for node, report in zip(ended, _fetch([self.tasks[n] for n in ended]), strict=True):
            self.ended[node] = report
            self._take_outcome(node, report)

    def _take_outcome(self, node: int, report: NodeReport) -> None:
        if report.ended_by == "refused":
            self._lose(node, "the engine ran its node task again after a worker died; refused")
            return
        if report.outcome is None:
            self._lose(node, f"its node process exited with code {report.exit_code}")
            return
        try:
            outcome = decode(report.outcome, *NODE_OUTCOMES, seal=self.seal)
        except ProtocolError as error:
            self._forgery(error)
            self._lose(node, "its report was not sealed by this run's node")
            return
        if isinstance(outcome, NodeValue):
            if node == 0:
                self.result.value, self.result.weights = outcome.value, outcome.weights
        elif isinstance(outcome, NodeFailed):
            self._node_failed(node, outcome.failures)
        elif isinstance(outcome, NodeError):
            rank = node * self.settings.num_processes
            failure = WorkerFailure(
                rank, None, outcome.exception_type, outcome.message, outcome.traceback,
                time.monotonic(),
            )  # fmt: skip
            self.result.failures.append(failure)
            self.end_all(f"node {node} failed")
        elif not self.abort:  # interrupted although nobody asked: treat as lost
            self._lose(node, "its node process was interrupted from outside")

    def _check_nodes(self) -> None:
        now = time.monotonic()
        if now - getattr(self, "_workers_read", 0.0) >= _WORKER_CHECK_SECONDS:
            self._workers_read = now
            try:
                present = self.engine.present()
            except Exception:
                present = None
            for node, report in enumerate(self.reports):
                running = node not in self.ended and node not in self.result.lost_nodes
                if running and present is not None and report.worker not in present:
                    self._lose(node, f"its {self.engine.worker_noun} left the cluster")
        for node, heard in enumerate(self.heard):
            running = node not in self.ended and node not in self.result.lost_nodes
            if running and now - heard > NODE_SILENCE_SECONDS:
                self._lose(node, f"no word from it for {NODE_SILENCE_SECONDS:g} s")

    def _lose(self, node: int, why: str) -> None:
        self.result.lost_nodes = (*self.result.lost_nodes, node)
        worker = self.reports[node].worker
        rank = node * self.settings.num_processes
        self.result.failures.append(node_lost(node, rank, worker, why, self.engine.worker_noun))
        self.end_all(f"node {node} lost")

    # -- control and cleanup --------------------------------------------------------------

    def _publish(self) -> None:
        control = Control(
            self._lease, self.result.stopped, self.abort, *self._stacks_asked, self._profile_asked
        )
        self.engine.publish(self.names, control_frame(control))

    def _renew(self) -> None:
        """The lease: a counter the nodes watch; it stops moving when this kernel dies."""
        while not self._lease_done.wait(CONTROL_PERIOD_SECONDS):
            self._lease += 1
            try:
                self._publish()
            except Exception:
                continue

    def _release(self) -> None:
        """Nothing of this attempt stays on the scheduler: tasks, variables, events."""
        self.stacks.close("the cluster run ended before every node answered")
        self._lease_done.set()
        if self._lease_thread.is_alive():
            self._lease_thread.join(timeout=5)
        self.end_all("finished")  # a node that never got to start must not start late
        try:
            self.engine.forget(self.names, self.num_nodes, self.tasks)
        finally:
            self.wake.close()
            self._ring.close()


def _fetch(tasks: list[NodeTask]) -> list[NodeReport]:
    """The tasks' reports, fetched together: one by one, those of 64 nodes took seconds."""
    if len(tasks) < 2:
        return [task.report() for task in tasks]
    with ThreadPoolExecutor(min(len(tasks), 16)) as fetch:
        return list(fetch.map(lambda task: task.report(), tasks))


def _batch(event: Any, num_nodes: int) -> tuple[int, list[bytes]]:
    """A node's batch as the engine delivers it, ``(time, {"node": n, "events": [...]})``,
    checked for its shape (anyone can post anything on the topic)."""
    try:
        message = event[1]
        node, frames = message["node"], message["events"]
    except (TypeError, KeyError, IndexError) as error:
        raise ProtocolError(f"not a batch of events ({type(error).__name__})") from None
    if type(node) is not int or not 0 <= node < num_nodes or not isinstance(frames, list | tuple):
        raise ProtocolError("not a batch of this run's nodes")
    return node, list(frames)


def nodes_per_host(reports: list[ProbeReport]) -> list[int]:
    """For each node, how many nodes of the run are on its host (they share its cores)."""
    return [sum(other.host == report.host for other in reports) for report in reports]
