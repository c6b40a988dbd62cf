"""The observer of a node process: it forwards what the launcher shows to the node task.

Every observer call becomes one encoded event frame on the pipe to the task, which batches
them to the scheduler (an event the kernel waits for leaves at once). A launch's one message
back, :class:`~notebook_kit.node.protocol.LaunchStop`, sets this node's stop flag, so the ranks'
stop vote ends every node at the same step, as the Stop button does on one machine (SIGTERM
too: :meth:`RelayObserver.preempt`). A line typed at a rank's pdb prompt comes back too, for
the supervisor's desk (:mod:`notebook_kit.launch.node_process.node_debugger`).
"""

from __future__ import annotations

from multiprocessing.connection import Connection

from notebook_kit.launch.node_process.node_debugger import RelayedDesk
from notebook_kit.launch.node_process.node_stacks import ASKS, NodeStackAnswers
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, Stream
from notebook_kit.node.protocol import (
    EVENT,
    URGENT,
    URGENT_EVENTS,
    DebuggerAnswer,
    LaunchStop,
    NodeEvent,
    NodeFinished,
    NodePrint,
    ProfileAsk,
    Seal,
    StacksAsk,
    decode,
    encode,
)
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch, OutputLine

__all__ = ["RelayObserver"]

_PREEMPTED = (
    "Node {node} received SIGTERM (its machine is being preempted, or the job reached its time "
    "limit): should_stop() turns True on every rank at the same step, so the function can save "
    "and return before the machine goes."
)


class RelayObserver:
    """A ``LaunchObserver`` whose view is the kernel on the other end of the cluster."""

    def __init__(self, node_rank: int, orders: Connection, events: Connection, seal: Seal) -> None:
        self.node_rank = node_rank
        self.seal = seal  # the run's: every frame either way is sealed with it
        self.orders = orders  # read at each tick; a launch's wait ends when one comes
        self.orders_ended = False
        self._events = events
        self._stop_flag: StopFlag | None = None
        self._preempted = False  # SIGTERM arrived
        self._announced = False  # and the kernel was told
        self._stacks = NodeStackAnswers(node_rank)
        self.debugger = RelayedDesk(self.send)  # the supervisor's desk: prompts go home

    def send(self, event: NodeEvent) -> None:
        tag = URGENT if isinstance(event, URGENT_EVENTS) else EVENT
        self._events.send_bytes(tag + encode(event, self.seal))

    def on_start(self, info: LaunchInfo) -> None:
        """The kernel showed the run's start itself; only the stop flag is kept."""
        self._stop_flag = info.stop_flag
        if self._preempted:
            info.stop_flag.preempt()

    def preempt(self) -> None:
        """This node received SIGTERM: the ranks' next stop vote ends the run on every node.

        Called from the signal handler, so it only sets flags; :meth:`on_tick` tells the kernel.
        """
        self._preempted = True
        if self._stop_flag is not None:
            self._stop_flag.preempt()

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        self.send(OutputLine(rank, stream, line))

    def on_metrics(self, batch: MetricsBatch) -> None:
        self.send(batch)

    def on_tick(self) -> None:
        if self._preempted and not self._announced:
            self._announced = True
            self.send(NodePrint(_PREEMPTED.format(node=self.node_rank)))
        self.send_stacks()
        try:
            while self.orders.poll(0):
                data = self.orders.recv_bytes()
                order = decode(data, LaunchStop, *ASKS, DebuggerAnswer, seal=self.seal)
                if isinstance(order, ASKS):
                    self.ask_stacks(order)
                elif isinstance(order, DebuggerAnswer):  # written by the supervisor's next turn
                    self.debugger.take(order)
                elif self._stop_flag is not None:
                    self._stop_flag.set()
        except (EOFError, OSError):
            self.orders_ended = True  # the task is gone: nothing more to wait for there

    def ask_stacks(self, order: StacksAsk | ProfileAsk) -> None:
        """The kernel's stacks() or profile(): answered off the loop, sent by
        :meth:`send_stacks`."""
        self._stacks.ask(order)
        self.send_stacks()  # at once when there is no run to ask

    def send_stacks(self) -> None:
        for answer in self._stacks.ready():
            self.send(answer)

    def on_finish(self, summary: LaunchSummary) -> None:
        failures = tuple(summary.failures)
        ranks = tuple(rank.rank for rank in summary.ranks)
        self.send(NodeFinished(self.node_rank, ranks, failures, summary.stopped))
