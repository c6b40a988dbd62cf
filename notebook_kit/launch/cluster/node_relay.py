"""The observer of a node process: it forwards what the launcher shows to the node task.

Every observer call becomes one encoded event frame on the pipe to the task, which batches
them to the scheduler (an event the kernel waits for leaves at once). A launch's one message
back, :class:`~notebook_kit.node.protocol.LaunchStop`, sets this node's stop flag, so the ranks'
stop vote ends every node at the same step, as the Stop button does on one machine.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

from notebook_kit.live.observer import LaunchInfo, LaunchSummary, Stream
from notebook_kit.node.protocol import (
    EVENT,
    URGENT,
    URGENT_EVENTS,
    LaunchStop,
    NodeEvent,
    NodeFinished,
    decode,
    encode,
)
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch, OutputLine

__all__ = ["RelayObserver"]


class RelayObserver:
    """A ``LaunchObserver`` whose view is the kernel on the other end of the cluster."""

    def __init__(self, node_rank: int, orders: Connection, events: Connection) -> None:
        self.node_rank = node_rank
        self._orders = orders
        self._events = events
        self._stop_flag: StopFlag | None = None

    def send(self, event: NodeEvent) -> None:
        tag = URGENT if isinstance(event, URGENT_EVENTS) else EVENT
        self._events.send_bytes(tag + encode(event))

    def on_start(self, info: LaunchInfo) -> None:
        """The kernel showed the run's start itself; only the stop flag is kept."""
        self._stop_flag = info.stop_flag

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        self.send(OutputLine(rank, stream, line))

    def on_metrics(self, batch: MetricsBatch) -> None:
        self.send(batch)

    def on_tick(self) -> None:
        try:
            while self._orders.poll(0):
                decode(self._orders.recv_bytes(), LaunchStop)
                if self._stop_flag is not None:
                    self._stop_flag.set()
        except (EOFError, OSError):
            return

    def on_finish(self, summary: LaunchSummary) -> None:
        failures = tuple(summary.failures)
        self.send(NodeFinished(self.node_rank, tuple(summary.ranks), failures, summary.stopped))
