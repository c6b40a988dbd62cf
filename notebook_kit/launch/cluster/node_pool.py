"""One node of a cluster pool: its ranks stay forked and grouped, serving the kernel's commands.

The node process builds the pool's :class:`~notebook_kit.launch.pool.persistent.PersistentLauncher`
with its :class:`~notebook_kit.launch.forking.NodeSeat`, says it is ready (with its ranks'
pids), then reads commands from its orders pipe, one at a time, until ``close``:

- ``("run", seq, kind, body, ranks, want)``: the pool command ``kind`` on this node's ranks
  among ``ranks`` (global); ``want``: the global ranks whose value comes back. Answered with
  an ``answer`` event.
- ``("stop", seq)``: the Stop button was pressed during ``seq``: this node's ranks read it at
  their next step, as on one machine.
- ``("interrupt", seq)``: another node's rank failed during ``seq``; this node's ranks are
  interrupted (the pool's own settling follows).
- ``("check", seq)``: the group check after a fault, on every node at once (a node cannot
  check alone: the all-reduce spans every node's ranks).
- ``("close",)``: the ranks leave the group and exit; the node process ends.

Runs on a node, in the node process.
"""

from __future__ import annotations

import collections
import functools
import pickle
from multiprocessing.connection import Connection
from typing import Any

from notebook_kit.config.launch_plan import LaunchPlan
from notebook_kit.launch.cluster.node_relay import RelayObserver
from notebook_kit.launch.forking import NodeSeat
from notebook_kit.launch.launchers.driver import run_blocking
from notebook_kit.launch.pool.persistent import PersistentLauncher
from notebook_kit.launch.pool.workers import PoolProcesses, RunOutcome, WorkersStopped
from notebook_kit.live.observer import Stream
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch

__all__ = ["serve_node_pool"]


class _NodeView:
    """The view of this node's commands: lines and metrics go on to the kernel as events."""

    def __init__(self, relay: RelayObserver, orders: Connection, stop_flag: StopFlag) -> None:
        self.relay, self.orders, self.stop_flag = relay, orders, stop_flag
        self.pending: collections.deque[bytes] = collections.deque()
        self.current = 0  # the order being served: only an interrupt of it ends it

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        self.relay.on_output(rank, stream, line)

    def on_metrics(self, batch: MetricsBatch) -> None:
        self.relay.on_metrics(batch)

    def on_tick(self) -> None:
        """Read the orders that came during a command; an interrupt ends it on every rank."""
        while self.orders.poll(0):
            frame = self.orders.recv_bytes()
            if frame == b"stop":  # a launch's Stop (the control variable): not a pool's
                continue
            order = pickle.loads(frame)
            if order[:2] == ("stop", self.current):
                self.stop_flag.set()
            elif order[:2] == ("interrupt", self.current):
                raise KeyboardInterrupt  # the pool's wait interrupts every rank of this node
            elif order[0] not in ("stop", "interrupt"):  # (one for a command already over)
                self.pending.append(frame)

    def next_order(self) -> tuple[Any, ...]:
        while True:
            frame = self.pending.popleft() if self.pending else self.orders.recv_bytes()
            if frame == b"stop":
                continue
            order = pickle.loads(frame)
            if order[0] not in ("stop", "interrupt"):  # late: their command has ended
                self.current = order[1] if len(order) > 1 else 0
                return order


def serve_node_pool(
    plan: LaunchPlan, relay: RelayObserver, seat: NodeSeat, orders: Connection
) -> tuple[Any, ...]:
    """Start this node's pool ranks and serve commands until ``close``; the node's outcome."""
    stop_flag = StopFlag()
    processes = PoolProcesses(plan, stop_flag)
    processes.check_after_fault = False  # the kernel asks every node to check at once
    try:
        launcher = PersistentLauncher(plan, processes, 0, seat)
        run_blocking(launcher.run(launcher.call(), observer=None))
        view = _NodeView(relay, orders, stop_flag)
        processes.relay.view = view
        relay.send("ready", relay.node_rank, tuple(processes.pids))
        while True:
            order = view.next_order()
            if order[0] == "close":
                processes.close()
                return ("value", None, {})
            if order[0] == "run":
                _answer(relay, processes, order[1], functools.partial(_run, processes, order))
            elif order[0] == "check":
                _answer(relay, processes, order[1], functools.partial(_check, processes))
    except WorkersStopped as stopped:
        return ("failed", tuple(stopped.failures))
    finally:
        processes.kill()


def _check(processes: PoolProcesses) -> dict[str, Any]:
    processes.check_group()
    return {}


def _run(processes: PoolProcesses, order: tuple[Any, ...]) -> dict[str, Any]:
    _, _, kind, body, ranks, want = order
    processes.stop_flag.clear()
    mine = [rank for rank in ranks if rank in processes.ranks]
    wanted = [rank for rank in want if rank in processes.ranks]
    # (the kernel times a command: it interrupts every node when its timeout passes)
    outcome = processes.execute(kind, body, mine, wanted) if mine else RunOutcome()
    return {
        "answers": outcome.answers,
        "interrupted": outcome.interrupted,
        "timed_out": outcome.timed_out,
    }


def _answer(relay: RelayObserver, processes: PoolProcesses, seq: int, work: Any) -> None:
    """Do one order and send its answer; workers that had to stop end this node too."""
    try:
        answer = {"status": "ok", **work()}
    except WorkersStopped as stopped:
        answer = {"status": "stopped", "reason": stopped.reason, "failures": stopped.failures}
        if stopped.outcome is not None:
            answer["answers"] = stopped.outcome.answers
        relay.send("answer", relay.node_rank, seq, answer)
        raise
    relay.send("answer", relay.node_rank, seq, answer)
