"""What the kernel shows of a launch: the observer interface and the data it receives.

The launcher calls an observer from the kernel's main thread while it waits on the workers:
``on_start`` once, then ``on_output``/``on_message`` as data arrives and ``on_tick`` at least
every quarter second, and ``on_finish`` once at the end (also after a failure or interrupt).
A plain console printer, the live widgets and plots all implement this one interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from notebook_kit.errors import WorkerFailure
from notebook_kit.runtime.context import StopFlag

__all__ = ["LaunchInfo", "LaunchObserver", "LaunchSummary", "RankSummary", "Stream"]

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class LaunchInfo:
    """The shape of a launch, known before the first worker starts."""

    banner: str
    num_processes: int
    world_size: int
    ranks: tuple[int, ...]
    stop_flag: StopFlag


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

    def on_message(self, rank: int, kind: str, payload: Any) -> None:
        """A message a worker sent with ``LaunchContext.send`` (e.g. logged metrics)."""

    def on_tick(self) -> None:
        """Called at least every quarter second while the workers run."""

    def on_finish(self, summary: LaunchSummary) -> None:
        """After every worker has ended, whatever the outcome."""
