"""What the kernel shows of a launch: the observer interface and the data it receives.

The launcher calls an observer from the kernel's main thread while it waits on the workers:
``on_start`` once, then ``on_output``/``on_metrics`` as data arrives and ``on_tick`` at least
every quarter second, and ``on_finish`` once at the end (also after a failure or interrupt).
What arrives is typed (:mod:`notebook_kit.runtime.messages`): the launcher decoded it once.
A plain console printer, the live widgets and plots all implement this one interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from notebook_kit.errors import WorkerFailure
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch

__all__ = [
    "LaunchInfo",
    "LaunchObserver",
    "LaunchSummary",
    "RankSummary",
    "Stream",
    "rank_label",
]

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class LaunchInfo:
    """The shape of a launch, known before the first worker starts."""

    banner: str
    num_processes: int
    world_size: int
    ranks: tuple[int, ...]
    stop_flag: StopFlag
    rank_nodes: tuple[int, ...] = ()  # the node of each rank in ``ranks``; empty: one node

    def node_of(self) -> dict[int, int]:
        """Rank -> node, for displays that show where each rank ran (empty on one node)."""
        return dict(zip(self.ranks, self.rank_nodes, strict=False))


def rank_label(rank: int, nodes: dict[int, int]) -> str:
    """``rank 3``, or ``rank 3 · node 1`` when the ranks ran on several nodes.

    Example:
        >>> rank_label(3, {3: 1}), rank_label(0, {})
        ('rank 3 · node 1', 'rank 0')
    """
    node = nodes.get(rank)
    return f"rank {rank}" if node is None else f"rank {rank} · node {node}"


@dataclass(frozen=True)
class RankSummary:
    """How one worker ended."""

    rank: int
    exit_code: int | None
    duration: float


@dataclass(frozen=True)
class LaunchSummary:
    """How a launch ended, handed to ``LaunchObserver.on_finish``."""

    ranks: tuple[RankSummary, ...]
    duration: float
    failures: tuple[WorkerFailure, ...] = ()
    timed_out: bool = False
    interrupted: bool = False
    stopped: bool = False  # the stop flag was set (Stop button) before the end
    error: BaseException | None = field(default=None, compare=False)
    workers_kept: bool = False  # a pool's run: its workers still run, with all they hold

    @property
    def succeeded(self) -> bool:
        return not (self.failures or self.timed_out or self.interrupted or self.error)

    @property
    def outcome(self) -> Literal["success", "stopped", "failed"]:
        """Stopped means stopped on request and then returned normally."""
        if not self.succeeded:
            return "failed"
        return "stopped" if self.stopped else "success"


class LaunchObserver(Protocol):
    """Receives everything the kernel can show about a running launch."""

    def on_start(self, info: LaunchInfo) -> None:
        """Before the first worker starts."""

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        """A whole line a worker printed, without its newline."""

    def on_metrics(self, batch: MetricsBatch) -> None:
        """Metrics a worker logged (and, from rank 0, its progress), one batch at a time."""

    def on_tick(self) -> None:
        """Called at least every quarter second while the workers run."""

    def on_finish(self, summary: LaunchSummary) -> None:
        """After every worker has ended, whatever the outcome."""
