"""The nodes of ``WorkerPool(cluster=client)``: every node's ranks stay forked and grouped.

One :class:`~notebook_kit.launch.cluster.attempt.ClusterAttempt`, started with ``pool=True``,
lasts the nodes' life: each node task keeps its node process, which keeps its ranks
(:mod:`notebook_kit.launch.node_process.pooling`). A command is one order broadcast to every node
as a Dask event (in order, none lost); each node answers with an event carrying its ranks'
answers. The attempt's loop still watches the nodes (a lost worker, silence, the kernel's
lease), so a node that goes away ends the nodes, and the kernel's death ends every node through
the lease.

Runs in the kernel.
"""

from __future__ import annotations

import time

import cloudpickle

from notebook_kit.errors import PoolFate, PoolRunError, WorkerFailure
from notebook_kit.launch.cluster.attempt import ClusterAttempt
from notebook_kit.launch.cluster.cluster_plan import ClusterPlan, check_cluster_mesh
from notebook_kit.launch.cluster.probing import check_reports
from notebook_kit.launch.interrupts import interrupt_taken
from notebook_kit.launch.pool.backend import RunOutcome, Settle, WorkersStopped
from notebook_kit.launch.pool.results import failures_of
from notebook_kit.launch.pool.shipping import WorkerHoldings
from notebook_kit.launch.pool.view import RunForward
from notebook_kit.live.observer import LaunchObserver
from notebook_kit.node.protocol import Interrupt, RunCommand, StopCommand
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import OutputLine
from notebook_kit.runtime.pool_commands import PoolCheck, PoolClose, PoolCommand

__all__ = ["CLOSED", "ClusterNodes"]

_START_SLACK = 60.0  # beyond the rendezvous timeout: node processes import torch and fork
_ANSWER_SECONDS = 10.0  # after an interrupt or a check: how long the nodes get to answer
_CLOSE_SECONDS = 10.0
_TICK_SECONDS = 0.1
CLOSED = (
    "The pool was closed on every node (everything defined on the ranks is lost); "
    "pool.restart() starts new nodes, as the next cell of the default %%distributed pool does."
)


def _ready() -> None:
    """The function the probe rebuilds on each worker (a pool's nodes run commands instead)."""


class ClusterNodes:
    """One generation of a cluster pool's nodes, from start to close.

    A :class:`~notebook_kit.launch.pool.backend.PoolBackend`, started by :meth:`start`; then
    :meth:`execute` runs one pool command on every node::

        nodes = ClusterNodes.start(plan, stop_flag, 0, holdings)
        outcome = nodes.execute(PoolPull("x"), ranks=[0, 1, 2, 3], want=[0])
        nodes.close()
    """

    # A fault that stops the ranks closes the pool: its nodes were chosen among the Dask
    # workers of that moment, which may be gone; a new pool chooses again.
    restarts_after_fault = False
    stopped_words = CLOSED
    num_processes: int
    world_size: int

    def __init__(self, plan: ClusterPlan, stop_flag: StopFlag) -> None:
        engine = plan.engine
        workers = engine.choose(plan.num_nodes)
        payload = cloudpickle.dumps(((_ready, (), {}), []))
        reports = engine.probe(workers, payload)
        check_reports(reports, engine.worker_noun, engine.ship_hint)
        settings = plan.settings.with_processes(reports[0].gpus)  # as for a launch
        check_cluster_mesh(settings, reports)  # before any node starts, as a launch
        self.num_processes = settings.num_processes
        self.world_size = self.num_processes * len(reports)
        self.workers = [report.worker for report in reports]
        self.alive = False
        self._ended = False
        self.stop_flag = stop_flag  # the kernel's; each node's own follows it per command
        self._forward = RunForward()
        self._never = StopFlag()  # the attempt's own Stop is a launch's; unused by a pool
        self._attempt = ClusterAttempt(
            engine, reports, payload, settings, self._forward, self._never, pool=True
        )
        self._seq = 0
        self._lost_at_fault: tuple[int, ...] = ()

    @classmethod
    def start(
        cls,
        plan: ClusterPlan,
        stop_flag: StopFlag,
        generation: int,
        holdings: WorkerHoldings,
        weights: None = None,  # a node's ranks send weights in their answers
    ) -> ClusterNodes:
        """Choose and probe the workers, start every node, wait until its ranks have grouped
        (``generation``: a new pool chooses its nodes anew, whichever it is)."""
        holdings.forget_all()  # a node holds nothing of this kernel's yet
        nodes = cls(plan, stop_flag)
        try:
            nodes._attempt.start()
            nodes.alive = True
            limit = nodes._attempt.settings.rendezvous_timeout + _START_SLACK
            deadline = time.monotonic() + limit
            while len(nodes._attempt.ready) < len(nodes.workers):
                nodes._step("while starting")
                if time.monotonic() > deadline:
                    raise WorkersStopped(
                        f"the nodes did not form their process group within {limit:g} s", []
                    )
        except BaseException:
            nodes.kill()
            raise
        return nodes

    @staticmethod
    def check_start(plan: ClusterPlan) -> None:
        """Nothing to check in the kernel: a node's ranks are forked on the node."""

    @staticmethod
    def weights_file() -> None:
        """None: a node's rank 0 sends the trained weights in its answer."""

    # -- what WorkerPool reads -----------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        """Every rank's process id, node by node (empty once closed)."""
        if not self.alive:
            return []
        return [pid for node in sorted(self._attempt.ready) for pid in self._attempt.ready[node]]

    @property
    def rank_nodes(self) -> tuple[int, ...]:
        return self._attempt.rank_nodes()

    def banner(self) -> str:
        return self._attempt.where()

    def attach(self, view: LaunchObserver | None) -> None:
        """Show the nodes' lines and metrics in ``view`` (None: hold lines for the next)."""
        self._forward.attach(view)

    def take_held_output(self) -> list[OutputLine]:
        return self._forward.take_held()

    def exit_codes(self) -> dict[int, int | None]:
        """No rank's exit code is known in the kernel: the answers say how each ended."""
        return dict.fromkeys(range(self.world_size))

    def lost_rank(self) -> str | None:
        """Between runs: how the nodes ended since the last run, or None while they run."""
        if not self.alive:
            return "the pool's nodes were closed"
        try:
            self._step("while the pool was idle", wait=0.0)
        except WorkersStopped as ending:
            return ending.reason
        return None

    def error(self, failures: list[WorkerFailure], aftermath: str, pool: PoolFate) -> PoolRunError:
        """The error that names a failed rank with its node and worker."""
        lost, noun = self._lost_at_fault, self._attempt.engine.worker_noun
        return PoolRunError(failures, self.world_size, aftermath, pool, self.workers, lost, noun)

    # -- commands ------------------------------------------------------------------------

    def execute(
        self, command: PoolCommand, ranks: list[int], want: list[int], timeout: float | None = None
    ) -> RunOutcome:
        """Run one pool command on ``ranks`` (global) of every node; ``want``: whose value.

        A node's failed rank interrupts the other nodes' ranks; Ctrl-C, a timeout or the Stop
        button reach every node at once. After a fault every node checks the group together.

        Raises:
            WorkersStopped: a node's ranks had to stop, or a node was lost.
        """
        outcome = RunOutcome()
        self._attempt.stacks.open(self._attempt.step)  # stacks() asks every node meanwhile
        try:
            self._seq += 1
            self._order(outcome, timeout, RunCommand(self._seq, command, (*ranks,), (*want,)))
            if outcome.faulted and len(ranks) == self.world_size:
                self._seq += 1
                self._order(RunOutcome(), None, RunCommand(self._seq, PoolCheck(), (), ()))
        except WorkersStopped as ending:
            ending.outcome = outcome
            self._lost_at_fault = tuple(self._attempt.result.lost_nodes)  # not those ended next
            raise
        finally:
            self._attempt.stacks.close("the command ended before every node answered")
        return outcome

    def _order(self, outcome: RunOutcome, timeout: float | None, order: RunCommand) -> None:
        """Send one order to every node and gather their answers into ``outcome``."""
        seq = order.seq
        self._attempt.command(order)
        deadline = None if timeout is None else time.monotonic() + timeout
        stop_sent, settle = False, Settle(_ANSWER_SECONDS, "node", "answer")
        if isinstance(order.command, PoolCheck):  # every node answers within the settling time
            settle.begin(time.monotonic())
        while True:
            try:
                got = {n: a for n, a in self._attempt.answers.items() if a.seq == seq}
                for answer in got.values():
                    outcome.answers.update(answer.answers)
                stopped = [a for a in got.values() if a.status == "stopped"]
                if stopped:
                    failures = failures_of(outcome.answers) + list(stopped[0].failures)
                    raise WorkersStopped(stopped[0].reason, failures)
                if len(got) == len(self.workers):  # (a node's ranks interrupted for a rank
                    return  # elsewhere: that rank's error is the command's)
                now = time.monotonic()
                ran = now - self._attempt.debugged  # the time at a rank's pdb prompt is not run
                if deadline is not None and ran >= deadline and not outcome.timed_out:
                    outcome.timed_out = True
                if self.stop_flag.is_set() and not stop_sent:
                    stop_sent = True
                    self._attempt.command(StopCommand(seq))
                if outcome.faulted:
                    settle.fault(now, lambda: self._attempt.command(Interrupt(seq)))
                late = settle.over(now) and settle.late(set(range(len(self.workers))) - set(got))
                if late:
                    raise WorkersStopped(late, failures_of(outcome.answers))
                self._step("during the run")
            except KeyboardInterrupt:
                interrupt_taken()  # the command ends for it: more presses only repeat it
                outcome.interrupted = True

    def _step(self, when: str, wait: float = _TICK_SECONDS) -> None:
        running = self._attempt.step(wait)
        if self._attempt.abort or not running:
            why = f"a node ended {when} ({self._attempt.abort or 'ended'})"
            raise WorkersStopped(why, list(self._attempt.result.failures))

    # -- the end -------------------------------------------------------------------------

    def close(self) -> None:
        """Every node's ranks leave the group and exit; nothing stays on any worker."""
        self._end(close=True)

    def kill(self) -> None:
        """End every node now (its ranks are interrupted and stopped), then release it all."""
        self._end(close=False)

    def _end(self, close: bool) -> None:
        if self._ended:
            return
        self._ended, self.alive = True, False
        try:
            if close and self._attempt.ready:
                self._attempt.command(RunCommand(self._seq + 1, PoolClose(), (), ()))
            else:
                self._attempt.end_all("the pool stopped its nodes")
        finally:
            self._attempt.finish(grace=_CLOSE_SECONDS if close else 2.0)
            self._never.close()
