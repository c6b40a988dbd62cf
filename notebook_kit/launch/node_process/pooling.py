"""One node of a cluster pool: its ranks stay forked and grouped, serving the kernel's commands.

The node process builds the pool's :class:`~notebook_kit.launch.pool.workers.PersistentLauncher`
with its :class:`~notebook_kit.launch.forking.NodeSeat`, says it is ready (with its ranks'
pids), then serves the kernel's :data:`~notebook_kit.node.protocol.NodeCommand` from its orders
pipe, one at a time, until a :class:`RunCommand` holds a ``PoolClose``; each is answered with a
:class:`NodeAnswer` of its ranks' answers. A ``PoolCheck`` is the group check after a fault, on
every node at once (the all-reduce spans every node's ranks). A Stop or an interrupt counts
only during its own command: the ranks read the Stop at their next vote, as on one machine, or
are interrupted (the pool's own settling follows).

Runs on a node, in the node process.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from multiprocessing.connection import Connection

from notebook_kit.config.launch_plan import LaunchPlan
from notebook_kit.launch.forking import NodeSeat
from notebook_kit.launch.launchers.driver import run_blocking
from notebook_kit.launch.node_process.node_stacks import ASKS
from notebook_kit.launch.node_process.relay import RelayObserver
from notebook_kit.launch.pool.backend import RunOutcome, WorkersStopped
from notebook_kit.launch.pool.workers import PersistentLauncher, PoolProcesses
from notebook_kit.live.observer import Stream
from notebook_kit.node.protocol import (
    NODE_COMMANDS,
    DebuggerAnswer,
    Interrupt,
    LaunchStop,
    NodeAnswer,
    NodeCommand,
    NodeFailed,
    NodeOutcome,
    NodeReady,
    NodeValue,
    RunCommand,
    StopCommand,
    decode,
)
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch, PoolAnswer
from notebook_kit.runtime.pool_commands import PoolCheck, PoolClose

__all__ = ["serve_node_pool"]


class _NodeView:
    """The view of this node's commands: lines and metrics go on to the kernel as events."""

    def __init__(self, relay: RelayObserver, orders: Connection, stop_flag: StopFlag) -> None:
        self.relay, self.orders, self.stop_flag = relay, orders, stop_flag
        self.pending: collections.deque[NodeCommand] = collections.deque()
        self.current = 0  # the command being served: only a Stop or interrupt of it counts

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        self.relay.on_output(rank, stream, line)

    def on_metrics(self, batch: MetricsBatch) -> None:
        self.relay.on_metrics(batch)

    def on_tick(self) -> None:
        """Read the orders that came during a command; an interrupt ends it on every rank."""
        while self.orders.poll(0):
            order = self._read()
            if isinstance(order, StopCommand):
                if order.seq == self.current:
                    self.stop_flag.set()
            elif isinstance(order, Interrupt):
                if order.seq == self.current:  # the pool's wait interrupts every rank here
                    raise KeyboardInterrupt
            elif order is not None:
                self.pending.append(order)
        self.relay.send_stacks()

    def next_order(self) -> RunCommand:
        while True:
            order = self.pending.popleft() if self.pending else self._read()
            if not isinstance(order, RunCommand):
                continue  # a Stop or interrupt come late: their command has ended
            if order.seq <= self.current:  # a replay of one served already: not again
                continue
            self.current = order.seq
            return order

    def _read(self) -> NodeCommand | None:
        seal = self.relay.seal
        kinds = (*NODE_COMMANDS, LaunchStop, *ASKS, DebuggerAnswer)
        order = decode(self.orders.recv_bytes(), *kinds, seal=seal)
        if isinstance(order, ASKS):  # the kernel's stacks() or profile() during a command
            self.relay.ask_stacks(order)
            return None
        if isinstance(order, DebuggerAnswer):  # a line typed at a rank's pdb prompt
            self.relay.debugger.take(order)
            return None
        return None if isinstance(order, LaunchStop) else order  # a launch's: not a pool's


def serve_node_pool(
    plan: LaunchPlan, relay: RelayObserver, seat: NodeSeat, orders: Connection
) -> NodeOutcome:
    """Start this node's pool ranks and serve commands until the pool closes; its outcome."""
    stop_flag = StopFlag()
    processes = PoolProcesses(plan, stop_flag)
    processes.check_after_fault = False  # the kernel asks every node to check at once
    processes.supervisor.debugger = relay.debugger  # a rank's pdb prompts: the kernel's cell
    try:
        launcher = PersistentLauncher(plan, processes, 0, seat)
        run_blocking(launcher.run(launcher.call(), observer=None))
        view = _NodeView(relay, orders, stop_flag)
        processes.relay.view = view
        relay.send(NodeReady(relay.node_rank, tuple(processes.pids)))
        while True:
            order = view.next_order()
            if isinstance(order.command, PoolClose):
                processes.close()
                return NodeValue()
            if isinstance(order.command, PoolCheck):
                _answer(relay, order.seq, lambda: _check(processes))
            else:
                _answer(relay, order.seq, lambda order=order: _run(processes, order))
    except WorkersStopped as stopped:
        return NodeFailed(tuple(stopped.failures))
    finally:
        processes.kill()


def _check(processes: PoolProcesses) -> dict[int, PoolAnswer]:
    processes.check_group()
    return {}


def _run(processes: PoolProcesses, order: RunCommand) -> dict[int, PoolAnswer]:
    processes.stop_flag.clear()
    mine = [rank for rank in order.ranks if rank in processes.ranks]
    wanted = [rank for rank in order.want if rank in processes.ranks]
    # (the kernel times a command: it interrupts every node when its timeout passes)
    outcome = processes.execute(order.command, mine, wanted) if mine else RunOutcome()
    return outcome.answers


def _answer(relay: RelayObserver, seq: int, work: Callable[[], dict[int, PoolAnswer]]) -> None:
    """Do one order and send its answer; workers that had to stop end this node too."""
    node = relay.node_rank
    try:
        answers = work()
    except WorkersStopped as stopped:
        done = stopped.outcome.answers if stopped.outcome is not None else {}
        failures = tuple(stopped.failures)
        relay.send(NodeAnswer(node, seq, "stopped", done, stopped.reason, failures))
        raise
    relay.send(NodeAnswer(node, seq, "ok", answers))
