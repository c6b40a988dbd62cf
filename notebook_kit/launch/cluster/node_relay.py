"""The observer of a node process: it forwards what the launcher shows to the node task.

Every observer call becomes one pickled event frame on the pipe to the task, which batches
them to the scheduler. The task's one message back, ``stop``, sets this node's stop flag, so
the ranks' stop vote ends every node at the same step, as the Stop button does on one machine.
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from notebook_kit.live.observer import LaunchInfo, LaunchSummary, Stream
from notebook_kit.node.protocol import EVENT
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch

__all__ = ["RelayObserver"]


class RelayObserver:
    """A ``LaunchObserver`` whose view is the kernel on the other end of the cluster."""

    def __init__(self, node_rank: int, orders: Connection, events: Connection) -> None:
        self.node_rank = node_rank
        self._orders = orders
        self._events = events
        self._stop_flag: StopFlag | None = None

    def send(self, *event: Any) -> None:
        self._events.send_bytes(EVENT + cloudpickle.dumps(event))

    def on_start(self, info: LaunchInfo) -> None:
        self._stop_flag = info.stop_flag
        self.send("start", self.node_rank, info.banner, info.ranks)

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        self.send("output", rank, stream, line)

    def on_metrics(self, batch: MetricsBatch) -> None:
        self.send("metrics", batch)

    def on_tick(self) -> None:
        try:
            while self._orders.poll(0):
                if self._orders.recv_bytes() == b"stop" and self._stop_flag is not None:
                    self._stop_flag.set()
        except (EOFError, OSError):
            return

    def on_finish(self, summary: LaunchSummary) -> None:
        ranks = tuple(summary.ranks)
        self.send("finish", self.node_rank, ranks, tuple(summary.failures), summary.stopped)
