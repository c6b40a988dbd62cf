"""The kernel's side of a pool's processes: fork them once, send commands, settle faults.

The workers are forked by the forked launcher's own fork, through
:class:`~notebook_kit.launch.pool.persistent.PersistentLauncher` (same fork-time hygiene, process
groups, death signal), and watched by its
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
import os
import pickle
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from notebook_kit.config.launch_plan import LaunchPlan
from notebook_kit.errors import WorkerError, WorkerFailure
from notebook_kit.launch.interrupts import interrupt_taken, interrupts_deferred
from notebook_kit.launch.pool.view import RunForward
from notebook_kit.launch.supervisor import Supervisor
from notebook_kit.live.observer import LaunchObserver
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import (
    OutputLine,
    PoolAnswer,
    Started,
    WorkerMessage,
)
from notebook_kit.worker.pool.command_loop import PoolChannels

__all__ = ["LOST", "PoolProcesses", "RunOutcome", "WorkersStopped", "hold_kernel_ends"]

_TICK_SECONDS = 0.25
_SETTLE_SECONDS = 1.0  # after a failure or interrupt: how long the other ranks get to stop
_CHECK_SECONDS = 0.4  # the all-reduce that checks the group after a fault
_CLOSE_SECONDS = 3.0  # for workers to leave the group cleanly when the pool closes

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


def hold_kernel_ends(channels: PoolChannels) -> None:
    """The kernel's write ends of a pool's pipes: closed in every child forked from now on."""
    _kernel_ends.update(channels.senders + channels.interrupters)


class WorkersStopped(Exception):
    """The workers had to be stopped; ``reason`` says why, ``failures`` what was seen.

    ``outcome`` holds the answers that came before (set when a command was running).
    """

    def __init__(self, reason: str, failures: list[WorkerFailure]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.failures = failures
        self.outcome: RunOutcome | None = None


@dataclass
class RunOutcome:
    """Every rank's answer to one command."""

    answers: dict[int, PoolAnswer] = field(default_factory=dict)
    interrupted: bool = False
    timed_out: bool = False

    @property
    def faulted(self) -> bool:
        return (
            self.interrupted
            or self.timed_out
            or any(answer.status != "ok" for answer in self.answers.values())
        )


class _Relay(RunForward):
    """The supervisor's observer: answers and readiness to the pool, the rest forwarded."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[int, PoolAnswer] = {}
        self.ready: set[int] = set()

    def on_start(self, info: Any) -> None:
        """The pool tells each run's view itself."""

    def on_other(self, rank: int, message: WorkerMessage) -> None:
        """The supervisor hands over what a launch does not know: answers and readiness."""
        if isinstance(message, PoolAnswer):
            self.answers[rank] = message
        elif isinstance(message, Started):
            self.ready.add(rank)

    def on_tick(self) -> None:
        """The pool ticks the view itself (:meth:`tick`), outside the part that defers Ctrl-C."""

    def tick(self) -> None:
        super().on_tick()

    def on_finish(self, summary: Any) -> None:
        """The pool tells each run's view itself."""


class PoolProcesses:
    """One generation of a pool's workers, from fork to stop.

    Started by :func:`~notebook_kit.launch.pool.persistent.start_workers`::

        processes = start_workers(plan, StopFlag(), generation=0)
        outcome = processes.execute("cell", body, ranks=[0, 1], want=[0])
        processes.close()
    """

    def __init__(self, plan: LaunchPlan, stop_flag: StopFlag) -> None:
        self.plan = plan
        self.stop_flag = stop_flag
        self.relay = _Relay()
        self.supervisor = Supervisor([], self.relay, on_other=self.relay.on_other)
        self.channels: PoolChannels | None = None
        self.alive = False
        self._numbers = itertools.count(1)
        self.first_rank = plan.global_rank(0)  # ranks are global; the pipes are per local rank
        self.check_after_fault = True  # a cluster node leaves the group check to the kernel

    # A fault that stops the workers leaves the pool usable: its next run forks new ones.
    restarts_after_fault = True

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
        return self.plan.banner().removeprefix("Launching ")

    def error(self, failures: list[WorkerFailure], aftermath: str) -> WorkerError:
        """The error that names a failed rank, and says what became of the workers."""
        from notebook_kit.launch.pool.results import PoolRunError

        return PoolRunError(failures, self.plan.world_size, aftermath)

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
        kind: str,
        body: bytes,
        ranks: list[int],
        want: list[int],
        timeout: float | None = None,
    ) -> RunOutcome:
        """Run one command on ``ranks`` (global ranks of these workers); ``want``: whose value.

        Raises:
            WorkersStopped: the workers were stopped (a rank died, did not stop in time, or the
                group is out of step after a fault).
        """
        command = next(self._numbers)
        self._poll()
        self.raise_if_dead("before the command started")
        self.relay.answers = {}
        for rank in ranks:
            self._send(rank, (kind, command, rank in want), body)
        outcome = RunOutcome()
        deadline = None if timeout is None else time.monotonic() + timeout
        self.supervisor.stall.start(self.plan.stall_seconds)
        try:
            self._collect(command, set(ranks), outcome, deadline)
            whole = len(ranks) == self.plan.num_processes
            if outcome.faulted and whole and self.check_after_fault:
                self.check_group()
        except WorkersStopped as ending:
            ending.outcome = outcome
            raise
        finally:
            self.supervisor.stall.stop()
        return outcome

    def _collect(
        self, command: int, ranks: set[int], outcome: RunOutcome, deadline: float | None
    ) -> None:
        """Wait for every rank's answer; on a fault or Ctrl-C, interrupt the rest and settle."""
        settle: list[float] = []  # when settling ends, once it has begun
        while True:
            try:
                if self._collect_step(command, ranks, outcome, deadline, settle):
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
        settle: list[float],
    ) -> bool:
        outcome.answers.update({r: a for r, a in self.relay.answers.items() if r in ranks})
        pending = ranks - set(outcome.answers)
        if not pending:
            return True
        self.raise_if_dead("during the command")
        now = time.monotonic()
        failed = any(a.status != "ok" for a in outcome.answers.values())
        if deadline is not None and now >= deadline:
            outcome.timed_out = True
        if not settle and (failed or outcome.interrupted or outcome.timed_out):
            settle.append(now + _SETTLE_SECONDS)
            self._interrupt(command, pending)
        if settle and now >= settle[0]:
            self._poll()  # a slow step may have kept answers that did come in time unread
            outcome.answers.update({r: a for r, a in self.relay.answers.items() if r in ranks})
            pending = ranks - set(outcome.answers)
        if settle and now >= settle[0] and pending:
            noun = "rank" if len(pending) == 1 else "ranks"
            ranks_text = ", ".join(str(r) for r in sorted(pending))
            raise WorkersStopped(
                f"{noun} {ranks_text} did not stop within {_SETTLE_SECONDS:g} s (blocked in "
                "native code, or in a collective operation waiting for a rank that had "
                "already stopped)",
                list(self.supervisor.failures),
            )
        limit = settle[0] - now if settle else _TICK_SECONDS
        if deadline is not None and not outcome.timed_out:
            limit = min(limit, deadline - now)
        self.serve(wait(self.supervisor.waitables(), max(limit, 0.0)))
        if not settle:  # drawing (a first matplotlib import) may be interrupted; not after
            self.relay.tick()
        return False

    def check_group(self) -> None:
        """After a fault: do all ranks still meet in a collective? If not, stop them."""
        command = next(self._numbers)
        self.relay.answers = {}
        ranks = set(self.ranks)
        for rank in ranks:
            self._send(rank, ("check", command, False), pickle.dumps(_CHECK_SECONDS))
        deadline = time.monotonic() + _CHECK_SECONDS + 0.3
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

    def _send(self, rank: int, header: tuple[str, int, bool], body: bytes) -> None:
        assert self.channels is not None
        try:
            sender = self.channels.senders[rank - self.first_rank]
            sender.send_bytes(pickle.dumps(header))
            sender.send_bytes(body)
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
            self.supervisor.serve(ready)

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
                    self._send(rank, ("close", 0, False), b"")
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
