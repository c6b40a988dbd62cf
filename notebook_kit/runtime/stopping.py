"""Stopping a run early and cleanly: every rank agrees on the same step.

The kernel's Stop button sets a shared flag, but the ranks read it at slightly different
moments. If one rank left the loop while another entered the next step's all-reduce, that
rank would wait forever. So the ranks vote: a small MAX all-reduce of their local readings,
and all of them get the same answer at the same call.

A vote costs a collective (hundreds of microseconds on a busy CPU), so the ranks do not vote
at every call: each vote also fixes, identically on every rank, how many calls pass before the
next one, aiming at about ten votes a second. A click therefore ends the run within roughly a
tenth of a second plus one step, and the check costs a fraction of a percent of the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from notebook_kit.runtime.context import LaunchContext
from notebook_kit.runtime.process_group import cpu_group

__all__ = ["should_stop"]

_VOTES_PER_SECOND = 10
_MAX_CALLS_BETWEEN_VOTES = 10_000
_EXTENSION = "stop_votes"  # where a context keeps its voting schedule


@dataclass
class _Votes:
    """One process's voting schedule (the same on every rank, decided by the votes)."""

    calls_until_vote: int = 0
    calls_since_vote: int = 0
    last_vote: float | None = None  # None before the first vote: no timing to go by


def should_stop(context: LaunchContext | None) -> bool:
    """True on every rank, at the same call, once the kernel asked the run to stop.

    A collective: call it on every rank at the same point of each step (typically after the
    optimizer step), the same number of times; every rank then gets the same answer.

    Args:
        context: The launch of this process (``runtime.current_launch()``).

    Returns:
        Whether the training loop should end now.

    Example::

        for batch in loader:
            train_step(batch)
            if should_stop(current_launch()):
                break
    """
    local = context is not None and context.stop_requested()
    if context is None or context.world_size == 1 or not dist.is_initialized():
        return local
    votes = context.extensions.get(_EXTENSION)
    if votes is None:
        votes = context.extensions[_EXTENSION] = _Votes()
    votes.calls_since_vote += 1
    if votes.calls_until_vote > 0:
        votes.calls_until_vote -= 1
        return False
    return _vote(votes, local)


def _vote(votes: _Votes, local: bool) -> bool:
    group = cpu_group()  # gloo beside nccl, so the vote stays on the CPU; made once, reused
    now = time.monotonic()
    proposal = 1
    if votes.last_vote is not None and now > votes.last_vote:
        seconds_per_call = (now - votes.last_vote) / votes.calls_since_vote
        proposal = int(1 / (_VOTES_PER_SECOND * seconds_per_call))
    proposal = min(max(proposal, 1), _MAX_CALLS_BETWEEN_VOTES)
    # One MAX all-reduce: the stop flag, and minus each rank's proposal (MAX of -p is min p).
    ballot = torch.tensor([1 if local else 0, -proposal], dtype=torch.int32)
    dist.all_reduce(ballot, op=dist.ReduceOp.MAX, group=group)
    votes.calls_until_vote = -int(ballot[1]) - 1
    votes.calls_since_vote = 0
    votes.last_vote = now
    return bool(ballot[0])
