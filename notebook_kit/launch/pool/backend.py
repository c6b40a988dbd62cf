"""What ``WorkerPool`` asks of the workers it drives: the :class:`PoolBackend` protocol.

Two backends implement it: :class:`~notebook_kit.launch.pool.workers.PoolProcesses` (ranks
forked from this kernel) and :class:`~notebook_kit.launch.cluster.pool.ClusterNodes` (ranks
kept on a cluster's nodes). Whatever differs between them (how they start, whether they need a
fork-safe kernel, how a failure names its rank, what a fault leaves of the pool) lives in the
backend, so the pool itself never asks where it runs.

Runs in the kernel (and a cluster's node process, which drives ``PoolProcesses`` too).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from notebook_kit.errors import PoolFate, PoolRunError, WorkerFailure
from notebook_kit.runtime.messages import OutputLine, PoolAnswer

if TYPE_CHECKING:
    from notebook_kit.launch.pool.shipping import WorkerHoldings
    from notebook_kit.live.observer import LaunchObserver
    from notebook_kit.runtime.context import StopFlag
    from notebook_kit.runtime.pool_commands import PoolCommand
    from notebook_kit.runtime.weights_file import WeightsFile

__all__ = [
    "LiveProcesses",
    "PoolBackend",
    "RunOutcome",
    "Settle",
    "WorkersStopped",
    "stop_at_exit",
]


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


class WorkersStopped(Exception):
    """The workers had to be stopped; ``reason`` says why, ``failures`` what was seen.

    ``outcome`` holds the answers that came before (set when a command was running).
    """

    def __init__(self, reason: str, failures: list[WorkerFailure]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.failures = failures
        self.outcome: RunOutcome | None = None


class Settle:
    """After a fault (a failed rank, Ctrl-C, a timeout): interrupt the ranks still running,
    once, give them ``seconds`` to answer, then name the late ones (:meth:`late`)."""

    def __init__(self, seconds: float, party: str, verb: str, why: str = "") -> None:
        self.seconds, self.party, self.verb, self.why = seconds, party, verb, why
        self.ends: float | None = None  # when settling ends, once it has begun
        self.interrupted = False
        self.first: float | None = None  # when the first fault was seen

    def begin(self, now: float) -> None:
        """Start the clock (once): the answers are due within ``seconds`` from now."""
        if self.ends is None:
            self.ends = now + self.seconds

    def fault(self, now: float, interrupt: Callable[[], None], grace: float = 0.0) -> None:
        """A fault: interrupt the others (the first time only) and start the clock; with a
        ``grace``, only once that long has passed since the first fault, so that ranks about
        to answer on their own (failing the same way) are not cut short."""
        if self.first is None:
            self.first = now
        if self.interrupted or now - self.first < grace:
            return
        self.interrupted = True
        interrupt()
        self.begin(now)

    def over(self, now: float) -> bool:
        return self.ends is not None and now >= self.ends

    def late(self, pending: Collection[int]) -> str | None:
        """Why the workers must stop when ``pending`` never answered; None if none is late."""
        if not pending:
            return None
        noun = self.party if len(pending) == 1 else f"{self.party}s"
        names = ", ".join(str(p) for p in sorted(pending))
        return f"{noun} {names} did not {self.verb} within {self.seconds:g} s{self.why}"


class PoolBackend(Protocol):
    """One generation of a pool's workers, from start to close, as ``WorkerPool`` drives it.

    ``restarts_after_fault``: a fault that stops the workers leaves the pool open (its next
    command starts new ones) rather than closed; ``stopped_words``: what the user is told is
    lost then. :meth:`start` also tells the pool's ``holdings`` what of the kernel's
    namespace the new workers hold; :meth:`check_start` refuses a start before the running
    workers are stopped for it (a kernel that can no longer fork); :meth:`weights_file` is
    where rank 0 writes trained weights, when the workers can share a file with the kernel
    (:meth:`start` gets it: workers that were not forked from the kernel are sent it).
    :meth:`execute` raises :class:`WorkersStopped` when the workers had to be stopped.
    """

    restarts_after_fault: ClassVar[bool]
    stopped_words: ClassVar[str]
    num_processes: int  # ranks on each machine
    world_size: int

    @classmethod
    def start(
        cls,
        plan: Any,
        stop_flag: StopFlag,
        generation: int,
        holdings: WorkerHoldings,
        weights: WeightsFile | None = None,
    ) -> PoolBackend: ...

    @staticmethod
    def check_start(plan: Any) -> None: ...

    @staticmethod
    def weights_file() -> WeightsFile | None: ...

    @property
    def pids(self) -> list[int]: ...

    @property
    def rank_nodes(self) -> tuple[int, ...]: ...

    def banner(self) -> str: ...

    def attach(self, view: LaunchObserver | None) -> None: ...

    def take_held_output(self) -> list[OutputLine]: ...

    def exit_codes(self) -> dict[int, int | None]: ...

    def execute(
        self, command: PoolCommand, ranks: list[int], want: list[int], timeout: float | None = None
    ) -> RunOutcome: ...

    def lost_rank(self) -> str | None: ...

    def error(
        self, failures: list[WorkerFailure], aftermath: str, pool: PoolFate
    ) -> PoolRunError: ...

    def close(self) -> None: ...

    def kill(self) -> None: ...


class LiveProcesses:
    """What a pool's finalizer needs, without the pool itself: the running backend."""

    def __init__(self) -> None:
        self.processes: PoolBackend | None = None
        self.pid = os.getpid()


def stop_at_exit(live: LiveProcesses) -> None:
    """The pool was collected or the kernel is exiting: stop its workers (in the kernel only)."""
    if os.getpid() == live.pid and live.processes is not None:
        live.processes.kill()
        live.processes = None
