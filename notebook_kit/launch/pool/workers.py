"""The kernel's side of a pool's processes: fork them once, send commands, settle faults.

The workers are forked by the forked launcher's own fork, through :class:`PersistentLauncher`
(same fork-time hygiene, process groups, death signal): what differs is what they run, the
pool's command loop, and that they stay. A kernel that cannot fork safely (a CUDA context, a
process group; :func:`~notebook_kit.launch.preflight.start_route`) has its clean template
process fork them instead (:mod:`notebook_kit.launch.template`): the command pipes and the
weights file travel there as descriptors, and the workers start from an empty namespace,
sent what each command needs as a cluster pool's are. Either way ``run`` returns them
running once every rank has formed the group and said so. They are watched by its
:class:`~notebook_kit.launch.supervisor.Supervisor`, which relays their output and messages.
Here a relay observer sorts those messages: command answers and readiness come to this module,
everything else (metrics, progress) goes to the view of the run in progress.

A command is sent to the ranks it concerns and answered by each. When one rank fails or the
user interrupts, the others are interrupted too and get a short grace period; then a small
all-reduce with a deadline checks that the ranks still meet. Anything else — a rank that died,
did not stop, or a group out of step — ends with the workers stopped (:class:`WorkersStopped`).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import time
import weakref
from multiprocessing.connection import Connection, wait
from typing import Any

from notebook_kit.config.launch_plan import LaunchPlan
from notebook_kit.errors import PoolFate, PoolRunError, WorkerFailure
from notebook_kit.launch.forking import NodeSeat
from notebook_kit.launch.interrupts import interrupt_taken, interrupts_deferred
from notebook_kit.launch.launchers.base import Steps
from notebook_kit.launch.launchers.driver import run_blocking
from notebook_kit.launch.launchers.forked import ForkedLauncher
from notebook_kit.launch.plan import Call
from notebook_kit.launch.pool.backend import RunOutcome, Settle, WorkersStopped
from notebook_kit.launch.pool.shipping import WorkerHoldings
from notebook_kit.launch.pool.view import PoolRelay
from notebook_kit.launch.preflight import start_route
from notebook_kit.launch.supervisor import Supervisor
from notebook_kit.launch.template import TemplateRoute
from notebook_kit.launch.template_shipping import PassedFd
from notebook_kit.launch.warmup import wait_for_warmup
from notebook_kit.live.observer import LaunchObserver
from notebook_kit.runtime import pool_commands
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import OutputLine
from notebook_kit.runtime.weights_file import WeightsFile
from notebook_kit.worker.pool.command_loop import PoolChannels, serve_pool

__all__ = ["LOST", "PersistentLauncher", "PoolProcesses"]

_TICK_SECONDS = 0.25
# After a rank fails: how long the others may take to answer by themselves before they are
# interrupted (every rank failing at the same line is then named so; a peer waiting in a
# collective for the failed rank is interrupted a moment later, at the next tick).
_PEERS_GRACE_SECONDS = 0.2
_SETTLE_SECONDS = 1.0  # after a failure or interrupt: how long the other ranks get to stop
_CLOSE_SECONDS = 3.0  # for workers to leave the group cleanly when the pool closes
_READY_SLACK = 30.0  # beyond the rendezvous timeout, to import and form the group
_LATE = (  # what keeps a rank from stopping
    " (blocked in native code, or in a collective operation waiting for a rank that had "
    "already stopped)"
)

LOST = "Everything defined on the workers is lost; the next run starts new workers."

_kernel_ends: weakref.WeakSet[Connection] = weakref.WeakSet()


def _close_kernel_ends() -> None:
    """In any child forked from the kernel: a pool's write ends are not the child's to hold."""
    for connection in list(_kernel_ends):
        with contextlib.suppress(OSError):
            connection.close()
    _kernel_ends.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_kernel_ends)


class PoolProcesses:
    """One generation of a pool's workers, from fork to stop.

    A :class:`~notebook_kit.launch.pool.backend.PoolBackend`, started by :meth:`start`::

        processes = PoolProcesses.start(plan, StopFlag(), 0, holdings)
        outcome = processes.execute(PoolPull("x"), ranks=[0, 1], want=[0])
        processes.close()
    """

    def __init__(self, plan: LaunchPlan, stop_flag: StopFlag, clean: str | None = None) -> None:
        self.plan = plan
        self.clean = clean  # why the template starts them (None: forked from the kernel)
        self.stop_flag = stop_flag
        self.relay = PoolRelay()
        self.supervisor = Supervisor([], self.relay, on_other=self.relay.on_other)
        self.channels: PoolChannels | None = None
        self.alive = False
        self._numbers = itertools.count(1)
        self.first_rank = plan.global_rank(0)  # ranks are global; the pipes are per local rank
        self.check_after_fault = True  # a cluster node leaves the group check to the kernel
        self.at_prompt = 0.0  # seconds this command waited for lines typed at a pdb prompt

    restarts_after_fault = True  # the next run forks new workers

    @classmethod
    def start(
        cls,
        plan: LaunchPlan,
        stop_flag: StopFlag,
        generation: int,
        holdings: WorkerHoldings,
        weights: WeightsFile | None = None,
    ) -> PoolProcesses:
        """Start a pool's workers (forked here, or by the clean template when this kernel
        cannot fork safely) and wait until each has joined the process group."""
        clean = start_route(None, "WorkerPool", plan.start_method)  # asked again at a restart
        if clean is None:
            holdings.remember_all()  # forked from here: the workers are about to hold all this
        else:
            holdings.forget_all()  # a clean process holds nothing of the kernel's
        launcher = PersistentLauncher(plan, cls(plan, stop_flag, clean), generation)
        return run_blocking(launcher.run(launcher.call(weights), observer=None))

    @staticmethod
    def check_start(plan: LaunchPlan) -> None:
        """Before workers are stopped for new ones: refuse a kernel that cannot fork them,
        when the start method is ``"fork"`` (else the template starts them)."""
        start_route(caller="WorkerPool", method=plan.start_method)

    @staticmethod
    def weights_file() -> WeightsFile:
        """Opened before the first fork, so every generation of workers holds it: rank 0
        writes the trained weights there, tensor by tensor, instead of into its answer."""
        return WeightsFile()

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def num_processes(self) -> int:
        return self.plan.num_processes

    @property
    def rank_nodes(self) -> tuple[int, ...]:
        return ()  # one machine: no node is named

    stopped_words = LOST

    def banner(self) -> str:
        """Where the workers run, and why they started from a clean process if they did."""
        text = self.plan.banner().removeprefix("Launching ")
        if self.clean is None:
            return text
        why = f"{self.clean[0].upper()}{self.clean[1:]}"
        return f"{text}. {why}: starting workers from a clean process"

    def error(self, failures: list[WorkerFailure], aftermath: str, pool: PoolFate) -> PoolRunError:
        """The error that names a failed rank, and says what became of the workers."""
        return PoolRunError(failures, self.plan.world_size, aftermath, pool)

    def attach(self, view: LaunchObserver | None) -> None:
        """Show the workers' lines and metrics in ``view`` (None: hold lines for the next)."""
        self.relay.attach(view)

    def exit_codes(self) -> dict[int, int | None]:
        """Each rank's exit code (None while it runs)."""
        return {worker.rank: worker.exit_code for worker in self.supervisor.workers}

    @property
    def ranks(self) -> list[int]:
        """This node's global ranks, whose answers and failures the supervisor reports."""
        return list(range(self.first_rank, self.first_rank + self.plan.num_processes))

    @property
    def pids(self) -> list[int]:
        """The workers' process ids, as their guardian reported them (empty when stopped)."""
        return [worker.pid for worker in self.supervisor.workers] if self.alive else []

    # -- commands ------------------------------------------------------------------------

    def execute(
        self,
        command: pool_commands.PoolCommand,
        ranks: list[int],
        want: list[int],
        timeout: float | None = None,
    ) -> RunOutcome:
        """Run one command on ``ranks`` (global ranks of these workers); ``want``: whose value.

        Raises:
            WorkersStopped: the workers were stopped (a rank died, did not stop in time, or the
                group is out of step after a fault).
        """
        number = next(self._numbers)
        self.at_prompt = 0.0
        if isinstance(command, pool_commands.PoolDebug):
            timeout = None  # the user at the prompt takes the time they need
        self._poll()
        self.raise_if_dead("before the command started")
        self.relay.answers = {}
        for rank in ranks:
            self._send(rank, pool_commands.PoolRequest(number, rank in want, command))
        outcome = RunOutcome()
        deadline = None if timeout is None else time.monotonic() + timeout
        self.supervisor.watch(self.plan.stall_seconds)
        try:
            self._collect(number, set(ranks), outcome, deadline)
            whole = len(ranks) == self.plan.num_processes
            if outcome.faulted and whole and self.check_after_fault:
                self.check_group()
        except WorkersStopped as ending:
            ending.outcome = outcome
            raise
        finally:
            self.supervisor.unwatch("the command ended before every rank answered")
        return outcome

    def _collect(
        self, command: int, ranks: set[int], outcome: RunOutcome, deadline: float | None
    ) -> None:
        """Wait for every rank's answer; on a fault or Ctrl-C, interrupt the rest and settle."""
        settle = Settle(_SETTLE_SECONDS, "rank", "stop", _LATE)
        while True:
            try:
                due = None if deadline is None else deadline + self.at_prompt  # not the code's
                if self._collect_step(command, ranks, outcome, due, settle):
                    return
            except KeyboardInterrupt:  # wherever it lands; a second one changes nothing
                outcome.interrupted = True
                interrupt_taken()  # the repeats of this press are absorbed

    def _collect_step(
        self,
        command: int,
        ranks: set[int],
        outcome: RunOutcome,
        deadline: float | None,
        settle: Settle,
    ) -> bool:
        outcome.answers.update({r: a for r, a in self.relay.answers.items() if r in ranks})
        pending = ranks - set(outcome.answers)
        if not pending:
            return True
        self.raise_if_dead("during the command")
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            outcome.timed_out = True
        if outcome.faulted:  # a failed rank's peers get a moment to answer by themselves
            grace = 0.0 if outcome.interrupted or outcome.timed_out else _PEERS_GRACE_SECONDS
            settle.fault(now, lambda: self._interrupt(command, pending), grace)
        if settle.over(now):
            self._poll()  # a slow step may have kept answers that did come in time unread
            outcome.answers.update({r: a for r, a in self.relay.answers.items() if r in ranks})
            late = settle.late(ranks - set(outcome.answers))
            if late:
                raise WorkersStopped(late, list(self.supervisor.failures))
        limit = _TICK_SECONDS if settle.ends is None else settle.ends - now
        if deadline is not None and not outcome.timed_out:
            limit = min(limit, deadline - now)
        self.serve(wait(self.supervisor.waitables(), max(limit, 0.0)))
        if settle.ends is None:  # drawing (a first matplotlib import) may be interrupted; not after
            self.relay.tick()
        return False

    def check_group(self) -> None:
        """After a fault: do all ranks still meet in a collective? If not, stop them."""
        request = pool_commands.PoolRequest(next(self._numbers), False, pool_commands.PoolCheck())
        self.relay.answers = {}
        ranks = set(self.ranks)
        for rank in ranks:
            self._send(rank, request)
        deadline = time.monotonic() + pool_commands.CHECK_SECONDS + 0.3
        with interrupts_deferred():  # short and bounded: Ctrl-C waits for it
            while set(self.relay.answers) != ranks and time.monotonic() < deadline:
                self.raise_if_dead("while checking the process group")
                self.serve(wait(self.supervisor.waitables(), deadline - time.monotonic()))
        answers = self.relay.answers
        bad = [r for r in ranks if r not in answers or answers[r].status != "ok"]
        if bad:
            details = [answers[r].detail for r in bad if r in answers and answers[r].detail]
            raise WorkersStopped(
                "the process group is out of step after the fault"
                + (f" ({details[0]})" if details else ""),
                list(self.supervisor.failures),
            )

    def _send(self, rank: int, request: pool_commands.PoolRequest) -> None:
        assert self.channels is not None
        try:
            sender = self.channels.senders[rank - self.first_rank]
            sender.send_bytes(pool_commands.encode(request))
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._poll()
            self.raise_if_dead("when the command was sent")
            raise

    def _interrupt(self, command: int, ranks: set[int]) -> None:
        assert self.channels is not None
        for rank in ranks:
            with contextlib.suppress(OSError):
                interrupter = self.channels.interrupters[rank - self.first_rank]
                interrupter.send_bytes(command.to_bytes(8, "little"))

    # -- watching ------------------------------------------------------------------------

    def serve(self, ready: list[Any]) -> None:
        with interrupts_deferred():  # a message is read whole, or not at all
            self.supervisor.serve(ready, prompts=False)
        desk = self.supervisor.debugger
        asked, started = desk.answered, time.monotonic()
        self.supervisor.answer_debugger()  # a rank's pdb prompt: Ctrl-C there must get through
        if desk.answered != asked:  # a line was typed: that wait counts against no timeout=
            self.at_prompt += time.monotonic() - started

    def _poll(self) -> None:
        self.serve(wait(self.supervisor.waitables(), 0))

    def lost_rank(self) -> str | None:
        """Between runs: how a rank that died since the last run ended, or None."""
        self._poll()
        try:
            self.raise_if_dead("while the pool was idle")
        except WorkersStopped as ending:
            return ending.reason
        return None

    def raise_if_dead(self, when: str) -> None:
        failures = [f for f in self.supervisor.failures if f.exit_code is not None]
        errors = [f for f in self.supervisor.failures if f.exit_code is None]
        if failures or errors:
            root = (errors or failures)[0]
            failures = list(self.supervisor.failures)
            raise WorkersStopped(f"rank {root.rank} {root.summary()} {when}", failures)

    # -- the end -------------------------------------------------------------------------

    def close(self) -> None:
        """Ask every worker to leave the group and exit; stop those that do not."""
        if not self.alive:
            return
        with interrupts_deferred():
            for rank in self.ranks:
                with contextlib.suppress(OSError, AssertionError):
                    self._send(rank, pool_commands.PoolRequest(0, False, pool_commands.PoolClose()))
            deadline = time.monotonic() + _CLOSE_SECONDS
            while any(w.alive for w in self.supervisor.workers) and time.monotonic() < deadline:
                self.supervisor.serve(wait(self.supervisor.waitables(), 0.05))
            self.kill()

    def kill(self) -> None:
        """Stop every worker now (SIGTERM, then SIGKILL), reap them, close every pipe."""
        with interrupts_deferred():
            self.supervisor.shutdown()
            self.supervisor.release()  # the guardian, which swept every descendant
            if self.channels is not None:
                for connection in (*self.channels.senders, *self.channels.interrupters):
                    _kernel_ends.discard(connection)
                    connection.close()
            self.alive = False

    def take_held_output(self) -> list[OutputLine]:
        """Lines printed while no run was shown (background threads between runs)."""
        return self.relay.take_held()


class PersistentLauncher(ForkedLauncher):
    """Forked workers that stay: ``run`` returns them running, ready for commands."""

    def __init__(
        self,
        plan: LaunchPlan,
        processes: PoolProcesses,
        generation: int,
        seat: NodeSeat | None = None,
    ) -> None:
        super().__init__(plan, seat)  # seat: one node of a cluster pool
        self.processes = processes
        self.generation = generation

    def call(self, weights: WeightsFile | None = None) -> Call:
        """The workers' function, the command loop, with a command and an interrupt pipe each.

        From the template, the call is shipped: it holds only the workers' read ends (sent
        as descriptors, as is ``weights``), and the workers take a ``__main__`` of their own.
        """
        count = self.plan.num_processes
        commands = [multiprocessing.Pipe(duplex=False) for _ in range(count)]
        interrupts = [multiprocessing.Pipe(duplex=False) for _ in range(count)]
        channels = PoolChannels(
            commands=[reader for reader, _ in commands],
            interrupts=[reader for reader, _ in interrupts],
            senders=[writer for _, writer in commands],
            interrupters=[writer for _, writer in interrupts],
        )
        # The kernel's write ends: closed in every child forked from now on.
        _kernel_ends.update(channels.senders + channels.interrupters)
        self.processes.channels = channels
        options: dict[str, Any] = {"post_mortem": self.plan.post_mortem}
        if self.processes.clean is None:
            return serve_pool, (channels,), options
        theirs = PoolChannels(channels.commands, channels.interrupts, [], [])
        if weights is not None:
            options["weights_fd"] = PassedFd(weights.fd)
        return serve_pool, (theirs,), {**options, "own_main": True}

    def run(self, call: Call, observer: LaunchObserver | None) -> Steps:
        """Fork, then wait until every rank reported it is ready; stop them all on any error.

        The pool's relay is the observer: each run's view is attached to it later.
        """
        processes = self.processes
        try:
            processes.alive = True
            if processes.clean is not None:
                self.route = TemplateRoute(processes.clean, call, {})
                yield from self.route.wait_ready()
            wait_for_warmup()  # here Ctrl-C stops the start; inside os.fork it is swallowed
            try:
                self.fork(
                    call, processes.supervisor, processes.stop_flag, frozenset(), self.generation
                )
            finally:
                assert processes.channels is not None
                processes.channels.close_readers()
            deadline = time.monotonic() + self.plan.rendezvous_timeout + _READY_SLACK
            while len(processes.relay.ready) < self.plan.num_processes:
                processes.raise_if_dead("while starting")
                if time.monotonic() > deadline:
                    raise WorkersStopped("the workers did not form their process group in time", [])
                processes.serve((yield processes.supervisor.waitables(), _TICK_SECONDS))
        except BaseException:
            processes.kill()
            raise
        return processes
