"""The kernel's side of a launch: watch the workers, relay their output, stop them.

One loop waits on every worker's pipes and the guardian's reports at once
(``multiprocessing.connection.wait``), so a large result is read while it is being written,
output appears as it is printed, and a dead rank is noticed within one wake-up. Nothing here
sleeps on a fixed schedule. The guardian (:mod:`notebook_kit.launch.guardian_link`) is the
workers' parent: it reports their exits and, at the end, stops them and all they started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from notebook_kit.errors import WorkerFailure, describe_exit
from notebook_kit.launch.debugger_desk import DebuggerDesk
from notebook_kit.launch.guardian_link import GuardianLink
from notebook_kit.launch.line_reader import LineReader
from notebook_kit.launch.profile_requests import RunDesk
from notebook_kit.launch.stall_watch import StallWatch
from notebook_kit.live.observer import LaunchObserver, RankSummary
from notebook_kit.runtime.codec import ProtocolError
from notebook_kit.runtime.messages import (
    DebuggerLeft,
    DebuggerLine,
    DebuggerPrompt,
    Failure,
    Finished,
    MetricsBatch,
    ProfileDone,
    Result,
    Stacks,
    WorkerMessage,
    decode,
    encode_line,
)
from notebook_kit.runtime.waiting import STOP_VOTE, collective_of, frames_in_traceback
from notebook_kit.worker.guardian import EXITED, NOT_STARTED, STARTED, TERMINATE_GRACE_SECONDS

__all__ = ["LaunchOutcome", "Supervisor", "WorkerProcess"]

# After the first failure, collect the others' reports this long before picking a culprit.
_FAILURE_SETTLE_SECONDS = 0.1
_SECONDARY_SETTLE_SECONDS = 1.0
_STOP_EXIT_CODES = (-int(signal.SIGTERM), -int(signal.SIGKILL))
# Longest sleep of the loop: bounds how late a timeout or an observer tick can be.
_TICK_SECONDS = 0.25
# How long the guardian may take to stop everything before it is killed itself (a process
# stuck in the kernel, state D, cannot die sooner).
_GUARDIAN_STOP_LIMIT = TERMINATE_GRACE_SECONDS + 10.0


@dataclass
class WorkerProcess:
    """The kernel's handle on one forked worker."""

    rank: int
    pid: int  # 0 until the guardian reports the fork
    stdout: LineReader
    stderr: LineReader
    messages: Connection
    started: float = field(default_factory=time.monotonic)
    exit_code: int | None = None
    ended: float | None = None
    reported: bool = False  # sent its result (rank 0) or that it finished
    finished: tuple[str, float] | None = None  # how and when its function ended
    error: Failure | None = None
    answers: Connection | None = None  # write end: the lines typed at this rank's pdb prompt

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    def waitables(self) -> list[Any]:
        objects: list[Any] = [r.fd for r in (self.stdout, self.stderr) if not r.closed]
        if not self.messages.closed:
            objects.append(self.messages)
        return objects


@dataclass
class LaunchOutcome:
    """How a launch ended: rank 0's result, or the failures."""

    result: Result | None
    failures: list[WorkerFailure]
    timed_out: bool = False


class Supervisor:
    """Runs the wait loop over forked workers and stops them when it must."""

    def __init__(
        self,
        workers: list[WorkerProcess],
        observer: LaunchObserver,
        on_other: Callable[[int, WorkerMessage], None] | None = None,
    ) -> None:
        """``on_other`` takes the messages a launch does not handle itself (a pool's answers)."""
        self.workers = workers
        self.observer = observer
        self.on_other = on_other
        self.guardian: GuardianLink | None = None
        self.result: Result | None = None
        self.failures: list[WorkerFailure] = []
        self.timed_out = False
        self._deadline: float | None = None
        self._stopping = False  # exits from here on are ours, not failures
        self._guardian_deadline = 0.0
        self.stall = StallWatch()  # started with the clock (a pool: for each command)
        self.stacks = RunDesk()  # stacks() and profile() ask here while the run is in progress
        self.debugger = DebuggerDesk()  # the prompts of ranks at a breakpoint()

    def start_clock(self, timeout: float | None, stall_seconds: float | None = None) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self.watch(stall_seconds)

    def watch(self, stall_seconds: float | None) -> None:
        """A run (a pool: a command) is in progress: watch for stalls, take stack requests."""
        self.stall.start(stall_seconds)
        self.stacks.open(self._pump)

    def unwatch(self, why: str = "the run ended before every rank answered") -> None:
        self.stall.stop()
        self.stacks.close(why)

    def _pump(self, limit: float) -> bool:
        """One turn of the loop for a caller on its thread (its own turn suspended)."""
        if self.wait_limit() is None:
            return False
        self.serve(wait(self.waitables(), limit))
        return True

    def wait_limit(self) -> float | None:
        """How long the next wait may block; None once the launch is over."""
        if not any(worker.alive for worker in self.workers):
            return None
        now = time.monotonic()
        if self.failures and now - self.failures[0].time > self._settle_seconds():
            return None
        if self._deadline is not None and now >= self._deadline:
            self.timed_out = True
            return None
        limit = _TICK_SECONDS
        if self._deadline is not None:
            limit = min(limit, self._deadline - now)
        if self.failures:
            limit = min(limit, _FAILURE_SETTLE_SECONDS / 4)
        return max(limit, 0.0)

    def _settle_seconds(self) -> float:
        """How long to collect reports after the first failure before stopping everyone.

        An error that only says a peer went away implies a rank died: wait longer for that
        death to be seen (a big process can take a while to exit under load).
        """
        if all(failure.is_secondary for failure in self.failures):
            return _SECONDARY_SETTLE_SECONDS
        return _FAILURE_SETTLE_SECONDS

    def waitables(self) -> list[Any]:
        """Every descriptor and connection the loop waits on."""
        objects = [obj for worker in self.workers for obj in worker.waitables()]
        if self.guardian is not None and not self.guardian.closed:
            objects.append(self.guardian.status_fd)
        return objects

    def serve(self, ready: list[Any], prompts: bool = True) -> None:
        """Handle what a wait returned, then let the observer refresh.

        ``prompts``: then ask a rank's pdb prompt in the cell (:meth:`answer_debugger`).
        """
        with self.stacks.turn():
            self._serve(ready)
            self.stacks.take(self.workers)
            self.stall.check(self.workers)
            self.observer.on_tick()
        if prompts:
            self.answer_debugger()

    def answer_debugger(self) -> None:
        """Ask the next pdb prompt of a rank in the cell (Ctrl-C there ends the wait).

        The time spent at the prompt is nobody's stall, and not the launch's ``timeout``.
        """
        spent = self.debugger.turn(self._answer)
        self.stall.in_debugger = self.debugger.ranks()
        if spent:
            self.stall.progress()
            if self._deadline is not None:
                self._deadline += spent

    def _answer(self, rank: int, line: DebuggerLine) -> None:
        worker = next(w for w in self.workers if w.rank == rank)
        if worker.answers is not None and worker.alive:
            with contextlib.suppress(OSError):  # it died meanwhile: its exit tells the rest
                worker.answers.send_bytes(encode_line(line))

    def rank_summaries(self) -> tuple[RankSummary, ...]:
        return tuple(
            RankSummary(w.rank, w.exit_code, (w.ended or time.monotonic()) - w.started)
            for w in self.workers
        )

    def outcome(self) -> LaunchOutcome:
        """What the launch came to; called after ``shutdown``, which drained every pipe."""
        if self.timed_out:
            return LaunchOutcome(None, [], timed_out=True)
        return LaunchOutcome(self.result, self.failures + self._early_leavers())

    def shutdown(self) -> None:
        """Have the guardian stop every worker and all they started, then close the pipes."""
        self._stopping = True
        self.unwatch()
        if self.guardian is not None:
            self._stop_guardian(self.guardian)
        for worker in self.workers:
            self._drain(worker)
        for worker in self.workers:
            if worker.alive:  # the guardian never reported it: it is gone with the guardian
                self._on_exit(worker, -int(signal.SIGKILL), time.monotonic())
            worker.messages.close()
            for reader in (worker.stdout, worker.stderr):
                reader.close(self.observer.on_output)

    def release(self) -> None:
        """Reap the guardian, which swept everything below it before ``shutdown`` returned.

        Kept apart from ``shutdown`` so the guardian's exit (unmapping a copy of the kernel's
        memory takes milliseconds) overlaps with what the kernel does meanwhile.
        """
        guardian = self.guardian
        if guardian is None or guardian.released:
            return
        if not guardian.release(1.0 + max(0.0, self._guardian_deadline - time.monotonic())):
            warnings.warn(
                f"The launch's guardian (pid {guardian.pid}) could not stop every process "
                f"within {_GUARDIAN_STOP_LIMIT:g} s and was killed; a process stuck in the "
                f"operating system (state D) may be left.",
                RuntimeWarning,
                stacklevel=3,
            )

    def _stop_guardian(self, guardian: GuardianLink) -> None:
        """Ask for the stop, keep relaying output and exits until the guardian has swept."""
        guardian.request_stop()
        self._guardian_deadline = time.monotonic() + _GUARDIAN_STOP_LIMIT
        while not guardian.closed and (left := self._guardian_deadline - time.monotonic()) > 0:
            self._serve(wait(self.waitables(), min(left, _TICK_SECONDS)))
        self._serve_guardian(guardian)

    # -- the loop's steps ----------------------------------------------------------------

    def _serve(self, ready: list[Any]) -> None:
        ready_ids = {id(obj) for obj in ready} | {obj for obj in ready if isinstance(obj, int)}
        for worker in self.workers:
            for reader in (worker.stdout, worker.stderr):
                if not reader.closed and reader.fd in ready_ids:
                    self.stall.progress()
                    reader.read(self.observer.on_output)
            if not worker.messages.closed and id(worker.messages) in ready_ids:
                self._receive(worker)
        guardian = self.guardian
        if guardian is not None and not guardian.closed and guardian.status_fd in ready_ids:
            self._serve_guardian(guardian)

    def _serve_guardian(self, guardian: GuardianLink) -> None:
        by_rank = {worker.rank: worker for worker in self.workers}
        for rank, event, value, when in guardian.read_records():
            worker = by_rank[rank]
            if event == STARTED:
                worker.pid = value
            elif event == EXITED and worker.alive:
                self._on_exit(worker, value, when)
            elif event == NOT_STARTED:
                worker.exit_code, worker.ended = 1, when
                self.failures.append(_not_started(worker, value, when))
        if guardian.closed and not self._stopping:
            for worker in self.workers:  # killed with the guardian (parent-death signal)
                if worker.alive:
                    self._on_exit(worker, -int(signal.SIGKILL), time.monotonic())

    def _receive(self, worker: WorkerProcess) -> None:
        """Read every message waiting on a worker's connection."""
        with contextlib.suppress(EOFError, OSError):
            while not worker.messages.closed and worker.messages.poll():
                try:
                    message = decode(worker.messages.recv_bytes())
                except ProtocolError:  # not a message of this version: dropped
                    continue
                self._handle_message(worker, message)
            return
        worker.messages.close()  # the worker is gone; its exit status tells the rest

    def _handle_message(self, worker: WorkerProcess, message: WorkerMessage) -> None:
        if isinstance(message, Stacks):  # asked for (stall watch, stacks()): not progress
            self.stall.on_stacks(worker.rank, list(message.threads))
            self.stacks.on_stacks(worker.rank, list(message.threads))
            return
        if isinstance(message, ProfileDone):  # asked for by profile(): not progress either
            self.stacks.on_profile(worker.rank, message)
            return
        self.stall.progress()
        if isinstance(message, (Result, Finished)):
            worker.reported = True
            worker.finished = (message.ended, message.time)
            if isinstance(message, Result):
                self.result = message
        elif isinstance(message, Failure):
            worker.error = message
            self.failures.append(message.on_rank(worker.rank))
        elif isinstance(message, MetricsBatch):
            self.observer.on_metrics(message)
        elif isinstance(message, (DebuggerPrompt, DebuggerLeft)):
            self.debugger.receive(message)
            self.stall.in_debugger = self.debugger.ranks()
        elif self.on_other is not None:
            self.on_other(worker.rank, message)

    def _on_exit(self, worker: WorkerProcess, exit_code: int, when: float) -> None:
        """A worker's exit, reported by the guardian after it swept the worker's group."""
        worker.ended = when
        worker.exit_code = exit_code
        self._drain(worker)
        self.debugger.forget(worker.rank)
        if worker.answers is not None:
            worker.answers.close()
        unexplained = worker.error is None and not (worker.exit_code == 0 and worker.reported)
        stopped_by_us = self._stopping and worker.exit_code in _STOP_EXIT_CODES
        if unexplained and not stopped_by_us:
            self.failures.append(_failure_from_exit(worker))

    def _early_leavers(self) -> list[WorkerFailure]:
        """Ranks whose function ended while the others still needed them.

        When every failure only says a peer went away and no rank died, the peer that went
        away is a rank that returned (or called ``sys.exit(0)``) before the failures: it is
        the cause, not the rank that lost it.
        """
        if not self.failures or not all(f.is_secondary for f in self.failures):
            return []
        first = min(failure.time for failure in self.failures)
        leavers = [w for w in self.workers if w.finished is not None and w.finished[1] < first]
        return [_left_early(worker, self.failures) for worker in leavers]

    def _drain(self, worker: WorkerProcess) -> None:
        """Read what a worker left in its pipes (it wrote all of it before exiting)."""
        if not worker.messages.closed:
            self._receive(worker)
        for reader in (worker.stdout, worker.stderr):
            reader.read(self.observer.on_output, budget=None)


def _failure_from_exit(worker: WorkerProcess) -> WorkerFailure:
    code = worker.exit_code if worker.exit_code is not None else -int(signal.SIGKILL)
    if code == 0:
        message = "exited with code 0 before its function returned (os._exit(0)?)"
    else:
        message = describe_exit(code)
    return _without_exception(worker, code, message, worker.ended or time.monotonic())


def _not_started(worker: WorkerProcess, error_number: int, when: float) -> WorkerFailure:
    message = f"could not be started: fork failed ({os.strerror(error_number)})"
    return _without_exception(worker, None, message, when)


def _left_early(worker: WorkerProcess, failures: list[WorkerFailure]) -> WorkerFailure:
    how, when = worker.finished or ("returned", time.monotonic())
    others = sorted({failure.rank for failure in failures})
    noun = "rank" if len(others) == 1 else "ranks"
    waits = sorted({c for f in failures if (c := collective_of(frames_in_traceback(f.traceback)))})
    where = f"in {' and '.join(waits)}" if waits else "in a collective or the process group"
    advice = "Have every rank make the same collective calls, and end all ranks together."
    if STOP_VOTE in waits:
        advice = (
            "should_stop() is a collective: call it on every rank at the same steps, and "
            "end all ranks together."
        )
    message = (
        f"{how} while {noun} {', '.join(map(str, others))} still needed it ({where}), so "
        f"they lost their peer. {advice}"
    )
    return _without_exception(worker, worker.exit_code, message, when)


def _without_exception(
    worker: WorkerProcess, exit_code: int | None, message: str, when: float
) -> WorkerFailure:
    """A rank that failed without a Python exception: ``message`` says how."""
    return WorkerFailure(
        rank=worker.rank,
        exit_code=exit_code,
        exception_type=None,
        message=message,
        traceback="",
        time=when,
    )
