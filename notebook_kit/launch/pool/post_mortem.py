"""``pool.debug()``: pdb in the frame where the pool's last failed command raised, in the cell.

A worker keeps the exception of its last failed command, frames and all, until its next
command (:mod:`notebook_kit.worker.pool.command_loop`). The kernel keeps what it needs to
choose among them and to refuse a request that cannot be met before anything is sent: which
command failed, on which ranks (the root cause first), and which workers hold the frames (a
restart or a stop since then took them away). The request itself is a ``PoolDebug`` command to
that one rank, whose pdb prompt the cell asks as it asks a ``breakpoint()``'s.

Runs in the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from notebook_kit.config import arguments
from notebook_kit.errors import choose_root_cause
from notebook_kit.launch.pool.backend import RunOutcome, WorkersStopped
from notebook_kit.launch.pool.results import failures_of
from notebook_kit.runtime.pool_commands import PoolCheck, PoolCommand, PoolDebug

__all__ = ["FailedCommand", "PostMortems"]

Execute = Callable[
    ..., object
]  # WorkerPool._execute: a command, shown in the cell, its errors raised

RERUN = (
    "Run the command again and call pool.debug() when it fails, or make the pool with "
    "post_mortem=True to open pdb on every failure at once."
)


@dataclass(frozen=True)
class FailedCommand:
    """The pool's last failed command, as ``pool.debug()`` needs it.

    Attributes:
        what: The command, as the pool names it ("cell", "run train").
        ranks: The ranks whose command raised, the root cause first.
        pids: The workers that hold the frames then.
        gone: Why the frames are gone already (the workers were stopped as it failed); empty
            while they are kept.
    """

    what: str
    ranks: tuple[int, ...]
    pids: tuple[int, ...]
    gone: str = ""


class PostMortems:
    """What ``pool.debug()`` may open: noted after each command, checked before each debug.

    Example::

        post_mortems = PostMortems()
        post_mortems.note(command, "cell", outcome, None, pool.pids)  # after every command
        post_mortems.open(None, pool.world_size, pool.pids, pool._execute)
    """

    def __init__(self) -> None:
        self.last: FailedCommand | None = None

    def note(
        self,
        command: PoolCommand,
        what: str,
        outcome: RunOutcome,
        error: BaseException | None,
        pids: list[int],
    ) -> None:
        """After a command: keep it if it failed (the workers drop an older one's frames)."""
        if isinstance(command, (PoolDebug, PoolCheck)):
            return  # a worker keeps its failure across these
        if error is not None:  # the workers were stopped: whatever failed, no frame is left
            reason = error.reason if isinstance(error, WorkersStopped) else "interrupted"
            self.last = FailedCommand(what, (), (), f"the workers were stopped after it: {reason}")
            return
        failures = failures_of(outcome.answers)
        if not failures:
            self.last = None
            return
        root = choose_root_cause(failures).rank
        ranks = (root, *sorted({f.rank for f in failures} - {root}))
        self.last = FailedCommand(what, ranks, tuple(pids))

    def choose(self, rank: Any, world_size: int, pids: list[int]) -> int:
        """The rank to debug, or an error naming the parameter and the fix; nothing is sent."""
        last = self.last
        if last is None:
            raise RuntimeError(
                "pool.debug() opens pdb where a command failed, but the pool's last command did "
                "not fail (or none has run yet). " + RERUN
            )
        gone = last.gone or ("" if tuple(pids) == last.pids else "stopped or restarted since")
        if gone:
            raise RuntimeError(
                f"pool.debug(): the workers that ran the failed {last.what} are gone ({gone}), "
                f"and its frames with them. {RERUN}"
            )
        if rank is not None:
            arguments.check_int("rank", rank, minimum=0)  # a whole number first: then its place
            if rank not in last.ranks:
                failed = ", ".join(map(str, last.ranks))
                where = "did not fail" if 0 <= rank < world_size else "is not a rank of the pool"
                raise ValueError(
                    f"rank={rank}: rank {rank} {where} (the pool's ranks are 0 to "
                    f"{world_size - 1}); in the last failed command ({last.what}), "
                    f"rank{'s' if len(last.ranks) > 1 else ''} {failed} failed. Pass one of "
                    f"them, or leave rank out for rank {last.ranks[0]}, the root cause."
                )
        return last.ranks[0] if rank is None else rank

    def open(self, rank: Any, world_size: int, pids: list[int], execute: Execute) -> None:
        """Check the request, then run a debug command on the rank chosen with the pool's
        ``execute``; it returns when the user leaves pdb there (``q`` or ``c``)."""
        chosen = self.choose(rank, world_size, pids)
        execute(PoolDebug(), [], "debug", text=True, record=False, on=[chosen])
