"""Stopping a run early and cleanly: every rank agrees on the same step.

The kernel's Stop button sets a shared flag, but the ranks read it at slightly different
moments. If one rank left the loop while another entered the next step's all-reduce, that
rank would wait forever. So the ranks vote: a small MAX all-reduce of their local readings,
and all of them get the same answer at the same call.

A vote costs a collective (hundreds of microseconds on a busy CPU), so the ranks do not vote
at every call: each vote also fixes, identically on every rank, how many calls pass before the
next one, aiming at about ten votes a second. A click therefore ends the run within roughly a
tenth of a second plus one step, and the check costs a fraction of a percent of the run.

The vote also carries why: a node that received SIGTERM (a preempted VM, a job at its time
limit) outvotes the Stop button, and says which node it was, so :func:`stop_reason` gives
every rank the same reason at the same call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from notebook_kit.runtime.context import LaunchContext, StopFlag
from notebook_kit.runtime.metrics import waiting_on_ranks
from notebook_kit.runtime.process_group import cpu_group

__all__ = ["should_stop", "stop_reason"]

_VOTES_PER_SECOND = 10
_MAX_CALLS_BETWEEN_VOTES = 10_000
_EXTENSION = "stop_votes"  # where a context keeps its voting schedule


@dataclass
class _Votes:
    """One process's voting schedule (the same on every rank, decided by the votes)."""

    calls_until_vote: int = 0
    calls_since_vote: int = 0
    last_vote: float | None = None  # None before the first vote: no timing to go by
    cause: int = 0  # what the deciding vote said (a StopFlag cause); 0 while running
    node: int | None = None  # the node that received SIGTERM, when that is the cause


def should_stop(context: LaunchContext | None) -> bool:
    """True on every rank, at the same call, once the kernel asked the run to stop or a node
    received SIGTERM (:func:`stop_reason` says which).

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
    if context is None:
        return False
    votes = context.extensions.get(_EXTENSION)
    if votes is None:
        votes = context.extensions[_EXTENSION] = _Votes()
    if context.world_size == 1 or not dist.is_initialized():
        votes.cause = context.stop_cause()
        votes.node = context.node_rank if votes.cause == StopFlag.PREEMPTED else None
        return bool(votes.cause)
    votes.calls_since_vote += 1
    if votes.calls_until_vote > 0:
        votes.calls_until_vote -= 1
        return False
    return _vote(votes, context)


def stop_reason(context: LaunchContext | None) -> str | None:
    """Why :func:`should_stop` turned True, the same text on every rank; None until it did.

    Example::

        if should_stop(context):
            print(stop_reason(context))  # "node 1 received SIGTERM (preempted, or ...)"
    """
    votes = context.extensions.get(_EXTENSION) if context is not None else None
    if votes is None or not votes.cause:
        return None
    if votes.cause == StopFlag.PREEMPTED:
        return (
            f"node {votes.node} received SIGTERM (its machine is being preempted, or the job "
            "reached its time limit)"
        )
    return "the Stop button was clicked"


def _vote(votes: _Votes, context: LaunchContext) -> bool:
    now = time.monotonic()
    proposal = 1
    if votes.last_vote is not None and now > votes.last_vote:
        seconds_per_call = (now - votes.last_vote) / votes.calls_since_vote
        proposal = int(1 / (_VOTES_PER_SECOND * seconds_per_call))
    proposal = min(max(proposal, 1), _MAX_CALLS_BETWEEN_VOTES)
    # One MAX all-reduce: the stop cause (preemption outvotes Stop), minus each rank's proposal
    # (MAX of -p is min p), and 1 + the node that received SIGTERM.
    cause = context.stop_cause()
    node = context.node_rank + 1 if cause == StopFlag.PREEMPTED else 0
    ballot = torch.tensor([cause, -proposal, node], dtype=torch.int32)
    with waiting_on_ranks(context):  # a faster rank waits here for the slowest: not compute
        group = cpu_group()  # gloo beside nccl, so the vote stays on the CPU; made once, reused
        dist.all_reduce(ballot, op=dist.ReduceOp.MAX, group=group)
    votes.calls_until_vote = -int(ballot[1]) - 1
    votes.calls_since_vote = 0
    votes.last_vote = now
    votes.cause = int(ballot[0])
    votes.node = int(ballot[2]) - 1 if votes.cause == StopFlag.PREEMPTED else None
    return bool(votes.cause)
