"""Failures of launched workers, as data and as the exceptions the kernel sees."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["PoolFate", "PoolRunError", "PortInUseError", "WorkerError", "WorkerFailure"]

PoolFate = Literal["running", "stopped", "closed"]  # PoolRunError.pool: what became of it

# Errors a rank raises only because another rank went away first: never the root cause.
_SECONDARY_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "socket closed",
    "ProcessGroupGloo",
    "NCCL communicator was aborted",
)


@dataclass(frozen=True)
class WorkerFailure:
    """What is known about one rank that did not finish normally.

    Attributes:
        rank: Global rank of the worker.
        exit_code: Exit status: negative for a signal (``-9`` for SIGKILL), None if unknown.
        exception_type: Qualified name of the Python exception, None if it died without one.
        message: The exception's message, or a description of the exit.
        traceback: The worker's formatted traceback ("" when there was no Python exception).
        time: ``time.monotonic()`` when the failure happened or was noticed.
        mesh: The rank's coordinates in its device mesh (``dp_replicate=1, dp_shard=0``),
            "" when it built none.
    """

    rank: int
    exit_code: int | None
    exception_type: str | None
    message: str
    traceback: str
    time: float
    mesh: str = ""

    @property
    def is_secondary(self) -> bool:
        """True when this looks like a consequence of another rank's failure."""
        return self.exception_type is not None and is_consequence(self.exception_type, self.message)

    def summary(self) -> str:
        """One line: the exception, or how the process ended."""
        if self.exception_type is not None:
            return f"{self.exception_type}: {self.message}" if self.message else self.exception_type
        return self.message


def is_consequence(exception_type: str, message: str) -> bool:
    """True for an error a rank raises only because a peer went away first."""
    if exception_type.endswith("DistBackendError"):
        return True
    text = message.lower()
    return any(marker.lower() in text for marker in _SECONDARY_MARKERS)


def describe_exit(exit_code: int) -> str:
    """Explain an exit status of a worker that did not raise a Python exception."""
    if exit_code < 0:
        number = -exit_code
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        hint = {
            "SIGKILL": " (killed from outside, or by the out-of-memory killer)",
            "SIGSEGV": " (a crash in native code)",
            "SIGABRT": " (aborted by native code)",
        }.get(name, "")
        return f"died from {name} ({number}) without a Python exception{hint}"
    return f"exited with code {exit_code} without a Python exception (os._exit or native code)"


def choose_root_cause(failures: list[WorkerFailure]) -> WorkerFailure:
    """The failure to blame: the earliest one that is not a consequence of another."""
    primary = [failure for failure in failures if not failure.is_secondary]
    return min(primary or failures, key=lambda failure: failure.time)


class WorkerError(RuntimeError):
    """A launched worker failed; the message names the rank and holds its traceback.

    Attributes:
        failure: The root-cause failure.
        failures: Every failure seen, root cause first.
        world_size: Number of processes in the launch.

    Example::

        try:
            notebook_launcher(train, num_processes=2)
        except WorkerError as error:
            print(error.failure.rank)
    """

    def __init__(self, failures: list[WorkerFailure], world_size: int) -> None:
        root = choose_root_cause(failures)
        self.failure = root
        others = sorted((f for f in failures if f is not root), key=lambda f: f.time)
        self.failures = [root, *others]
        self.world_size = world_size
        super().__init__(self._format())

    @property
    def rank(self) -> int:
        """Rank of the root-cause failure."""
        return self.failure.rank

    def restart_reason(self) -> str:
        """What a restart of every worker answers, said in the cell before it starts them."""
        return f"Rank {self.failure.rank} failed ({self.failure.summary()})"

    def _format(self) -> str:
        root = self.failure
        lines = [
            f"{self._named(root.rank)} of {self.world_size}{_at(root)} failed: {root.summary()}",
            *self._after(self.failures[1:]),
        ]
        if root.traceback:
            lines += ["", f"Traceback of rank {root.rank}:", root.traceback.rstrip()]
        return "\n".join(lines)

    def _named(self, rank: int) -> str:
        return f"Rank {rank}"

    def _after(self, others: list[WorkerFailure]) -> list[str]:
        """What became of the workers, and the other failures."""
        lines = [
            "The other workers were stopped; the kernel is still usable: fix the cause and "
            "run the cell again."
        ]
        if others:
            ranks = ", ".join(str(f.rank) for f in others)
            noun = "Rank" if len(others) == 1 else "Ranks"
            lines.append(f"{noun} {ranks} failed afterwards, likely as a consequence.")
        return lines


class PoolRunError(WorkerError):
    """A pool command failed on some rank; the message names it (with its node and worker on
    a cluster), says what became of the pool and holds the rank's traceback.

    Catch :class:`WorkerError` to handle a launch's failure and a pool's alike.

    Attributes:
        pool: What became of the pool: ``"running"`` (the workers keep their state),
            ``"stopped"`` (the next command starts new workers) or ``"closed"``.
        aftermath: The same, as the message says it.
        nodes: On a cluster, each node's worker address (empty on one machine).
        lost_nodes: Nodes whose worker died or went silent.

    Example::

        try:
            pool.run(train)
        except WorkerError as error:
            print(error.rank, error.failure.exception_type)
    """

    def __init__(
        self,
        failures: list[WorkerFailure],
        world_size: int,
        aftermath: str,
        pool: PoolFate = "running",
        nodes: Sequence[str] = (),
        lost_nodes: tuple[int, ...] = (),
        worker_noun: str = "",
    ) -> None:
        self.aftermath, self.pool = aftermath, pool
        self.nodes, self.lost_nodes, self.worker_noun = list(nodes), lost_nodes, worker_noun
        super().__init__(failures, world_size)
        if len(failures) > 1 and len({(f.exception_type, f.message) for f in failures}) == 1:
            self.failures = sorted(failures, key=lambda failure: failure.rank)
            self.failure = self.failures[0]  # the same error everywhere: show rank 0's
            self.args = (self._format(),)

    def _named(self, rank: int) -> str:
        """ "Rank 3", or on a cluster "Rank 3 (node 1, Dask worker tcp://...)"."""
        if not self.nodes:
            return f"Rank {rank}"
        node = rank // max(self.world_size // len(self.nodes), 1)
        return f"Rank {rank} (node {node}, {self.worker_noun} {self.nodes[node]})"

    def _after(self, others: list[WorkerFailure]) -> list[str]:
        root = self.failure
        alike = all(
            (f.exception_type, f.message) == (root.exception_type, root.message) for f in others
        )
        if others and alike:
            noun = "Rank" if len(others) == 1 else "Ranks"
            lines = [f"{noun} {', '.join(str(f.rank) for f in others)} failed the same way."]
        else:
            lines = [f"Rank {f.rank} failed too: {f.summary()}" for f in others]
        return [*lines, self.aftermath]


def _at(failure: WorkerFailure) -> str:
    return f" (mesh coordinates {failure.mesh})" if failure.mesh else ""


class PortInUseError(OSError):
    """The requested rendezvous port is already taken."""
