"""A collective that only some ranks enter fails within seconds instead of hanging.

``get_state_dict``, ``save_state`` and ``save_model`` need every rank (FSDP gathers shards,
checkpoints wait for every rank's files). Called under ``if accelerator.is_main_process:`` the
others never arrive, and torch waits for its process-group timeout (30 minutes by default)
with nothing on screen. Before such a call each rank checks in on the process group's own
store under the call's sequence number in this launch (every rank counts the same guarded
calls, whichever Accelerator made them); a rank that waits longer than the check's timeout
raises :class:`CollectiveMismatchError` naming the call, the ranks that entered it and the
fix. Ranks that entered different calls at the same point are named too.
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta

import torch.distributed as dist

from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.metrics import waiting_on_ranks

__all__ = ["TIMEOUT_VARIABLE", "CollectiveGuard", "CollectiveMismatchError"]

TIMEOUT_VARIABLE = "NOTEBOOK_KIT_COLLECTIVE_CHECK_TIMEOUT"
_DEFAULT_TIMEOUT = 10.0  # seconds: ranks train in lockstep, so they arrive close together


class CollectiveMismatchError(RuntimeError):
    """Not every rank entered the same collective call at the same point."""


def _timeout() -> float:
    raw = os.environ.get(TIMEOUT_VARIABLE, "")
    try:
        value = float(raw) if raw else _DEFAULT_TIMEOUT
    except ValueError as error:
        raise ValueError(f"{TIMEOUT_VARIABLE}={raw!r} must be a number of seconds.") from error
    if value <= 0:
        raise ValueError(f"{TIMEOUT_VARIABLE}={raw!r} must be a positive number of seconds.")
    return value


def _default_store() -> dist.Store | None:
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, AttributeError, ValueError):  # a group made without a store
        return None


_OUTSIDE_LAUNCHES = itertools.count()  # under torchrun: one count for the process


def _next_number() -> int:
    """The guarded call's number in this launch (a pool command counts afresh)."""
    launch = current_launch()
    if launch is None:
        return next(_OUTSIDE_LAUNCHES)
    counter = launch.extensions.setdefault(__name__, itertools.count())
    return next(counter)


class CollectiveGuard:
    """Checks, per Accelerator, that every rank enters each guarded collective together.

    Example::

        guard = CollectiveGuard(rank=0, world_size=2)
        guard.enter("get_state_dict")  # returns once rank 1 entered its next guarded call
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size

    def enter(self, call: str) -> None:
        """Return once every rank entered ``call`` as its guarded call number ``sequence``."""
        store = _default_store() if self.world_size > 1 else None
        if store is None:
            return
        key = f"notebook_kit/collective/{_next_number()}"
        keys = [f"{key}/{rank}" for rank in range(self.world_size)]
        store.set(keys[self.rank], call)
        timeout = _timeout()
        try:
            with waiting_on_ranks(current_launch()):  # for the slowest rank: the step's wait
                store.wait(keys, timedelta(seconds=timeout))
        except (dist.DistStoreError, RuntimeError) as error:
            entered = [rank for rank, name in enumerate(keys) if store.check([name])]
            store.delete_key(keys[self.rank])  # a pool's next command starts clean
            raise CollectiveMismatchError(self._missing(call, entered, timeout)) from error
        calls = {rank: store.get(name).decode() for rank, name in enumerate(keys)}
        if store.add(f"{key}/read", 1) == self.world_size:  # the last reader tidies up
            for name in (*keys, f"{key}/read"):
                store.delete_key(name)
        if len(set(calls.values())) > 1:
            raise CollectiveMismatchError(self._different(call, calls))

    def _missing(self, call: str, entered: list[int], timeout: float) -> str:
        missing = [rank for rank in range(self.world_size) if rank not in entered]
        return (
            f"accelerator.{call}() is a collective: every process must call it, but only "
            f"rank {_ranks(entered)} of {self.world_size} entered it within {timeout:g} s "
            f"(rank {_ranks(missing)} did not). Call it on every process, not under "
            f"`if accelerator.is_main_process:` — it writes or returns the result on the main "
            f"process only by itself. (A rank that is merely slower than {timeout:g} s: raise "
            f"{TIMEOUT_VARIABLE}.)"
        )

    def _different(self, call: str, calls: dict[int, str]) -> str:
        which = ", ".join(f"rank {rank}: {name}()" for rank, name in calls.items())
        return (
            f"The processes entered different collectives at the same point ({which}); "
            f"accelerator.{call}() must be called by every process, in the same order."
        )


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(rank) for rank in ranks) or "none"
