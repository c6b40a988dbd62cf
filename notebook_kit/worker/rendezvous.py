"""Forming the process group inside a worker, with a bounded wait for the other ranks.

Rank 0 of node 0 serves a ``TCPStore`` on the socket its kernel bound before forking; every
other rank connects to it. Before the group is created, all ranks check in on the store, so a
node that never arrives ends the launch with a clear error after ``rendezvous_timeout``
instead of hanging for torch's 30-minute default. Every wait here is bounded by
``rendezvous_timeout``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from notebook_kit.worker.spec import WorkerSpec

__all__ = [
    "RendezvousTimeout",
    "join_process_group",
    "leave_process_group",
    "mark_debugging",
]


class RendezvousTimeout(RuntimeError):
    """Not every rank of the job joined, or finished, within the rendezvous timeout."""


def join_process_group(spec: WorkerSpec) -> dist.Store:
    """Connect to the store, wait for every rank, and initialise the default group.

    Every key, torch's own included, lives under the launch's ``store_prefix``: on one node
    it is a random secret the kernel handed over through the fork, so another local process
    that connects to the port cannot touch this launch's keys.
    """
    store = dist.PrefixStore(spec.store_prefix, _connect_store(spec))
    if spec.plan.num_nodes > 1:  # on one node the kernel forked every rank and sees any death
        _wait_for_everyone(store, spec, "joined", _not_joined)
    device_id = None
    if spec.plan.backend == "nccl":
        torch.cuda.set_device(spec.local_rank)
        device_id = torch.device("cuda", spec.local_rank)
    waits = spec.plan.collective_timeout  # None: torch's own default for the backend
    dist.init_process_group(
        spec.plan.backend,
        store=store,
        rank=spec.rank,
        world_size=spec.plan.world_size,
        device_id=device_id,
        **({} if waits is None else {"timeout": timedelta(seconds=waits)}),
    )
    # A rank's init can return before its peers have finished their handshake with it; had
    # it crashed right away, theirs would fail too. Nobody starts until everybody is ready.
    _wait_for_everyone(store, spec, "ready", _not_ready)
    return store


def leave_process_group(store: dist.Store, spec: WorkerSpec) -> None:
    """Check out; the rank hosting the store stays until every rank is done.

    The store lives in that rank's process: leaving early would cut off ranks that are still
    finishing (even still completing their gloo handshake). It waits at most
    ``rendezvous_timeout`` for the last rank. The group itself is not torn down: the worker
    ends with ``os._exit`` right after, the system closes its sockets, and an orderly gloo
    shutdown would add about 20 ms to every launch for nothing.
    """
    store.set(f"finished/{spec.rank}", "1")
    while spec.listen_fd is not None:
        try:
            _wait_for_everyone(store, spec, "finished", _not_finished, checked_in=True)
            return
        except RendezvousTimeout:  # a rank at its pdb prompt is not late: wait again
            if not any(_debugging(rank) for rank in range(spec.plan.world_size)):
                raise


def mark_debugging(rank: int, debugging: bool) -> None:
    """Say on the group's store that ``rank`` is at a pdb prompt (or no longer is).

    The rank that hosts the store waits for that rank beyond ``rendezvous_timeout`` when the
    others have finished: the time a user spends at the prompt is not a late rank.
    """
    store = _group_store()
    if store is not None:
        with contextlib.suppress(dist.DistError, RuntimeError):  # the host is gone: no one waits
            store.set(f"debugging/{rank}", "1" if debugging else "0")


def _debugging(rank: int) -> bool:
    store = _group_store()
    key = f"debugging/{rank}"
    return store is not None and _has(store, key) and store.get(key) == b"1"


def _group_store() -> dist.Store | None:
    """The default group's store, shared by every rank; None outside a group."""
    if not dist.is_initialized():
        return None
    return dist.distributed_c10d._get_default_store()


def _wait_for_everyone(
    store: dist.Store,
    spec: WorkerSpec,
    step: str,
    explain: Callable[[list[int], WorkerSpec], str],
    *,
    checked_in: bool = False,
) -> None:
    """Check this rank in at ``step`` and wait, at most ``rendezvous_timeout``, for the rest.

    One key per rank, not a shared counter: nothing another rank or process adds can make a
    count come out wrong and leave everyone waiting.
    """
    plan = spec.plan
    if not checked_in:
        store.set(f"{step}/{spec.rank}", "1")
    keys = [f"{step}/{rank}" for rank in range(plan.world_size)]
    try:
        store.wait(keys, timedelta(seconds=plan.rendezvous_timeout))
    except (dist.DistError, RuntimeError) as error:
        missing = [rank for rank, key in enumerate(keys) if not _has(store, key)]
        if not missing:  # everyone arrived just as the wait gave up
            return
        raise RendezvousTimeout(explain(missing, spec)) from error


def _has(store: dist.Store, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except (dist.DistError, RuntimeError):
        return False


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(str(rank) for rank in ranks[:16])
    return shown + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")


def _not_joined(missing: list[int], spec: WorkerSpec) -> str:
    plan = spec.plan
    return (
        f"Only {plan.world_size - len(missing)} of {plan.world_size} processes joined the "
        f"rendezvous within {plan.rendezvous_timeout:g} s (num_nodes={plan.num_nodes}; "
        f"missing ranks {_ranks(missing)}). Start the launch on every node with the same "
        f"num_nodes, num_processes, master_addr and use_port."
    )


def _not_ready(missing: list[int], spec: WorkerSpec) -> str:
    return (
        f"Ranks {_ranks(missing)} did not finish setting up the process group within "
        f"rendezvous_timeout={spec.plan.rendezvous_timeout:g} s. Raise rendezvous_timeout if "
        f"the machine is very busy."
    )


def _not_finished(missing: list[int], spec: WorkerSpec) -> str:
    return (
        f"Rank {spec.rank} hosts the rendezvous and finished, but ranks {_ranks(missing)} did "
        f"not finish within rendezvous_timeout={spec.plan.rendezvous_timeout:g} s after it. "
        f"End the function with accelerator.wait_for_everyone() (or dist.barrier()) so all "
        f"ranks finish together, or raise rendezvous_timeout."
    )


def _connect_store(spec: WorkerSpec) -> dist.TCPStore:
    plan = spec.plan
    timeout = timedelta(seconds=plan.rendezvous_timeout)
    if spec.listen_fd is not None:
        return dist.TCPStore(
            plan.master_addr,
            spec.master_port,
            plan.world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=spec.listen_fd,
        )
    try:
        return dist.TCPStore(
            plan.master_addr, spec.master_port, plan.world_size, is_master=False, timeout=timeout
        )
    except (dist.DistError, RuntimeError) as error:
        raise RendezvousTimeout(
            f"Rank {spec.rank} could not reach the rendezvous at "
            f"{plan.master_addr}:{spec.master_port} within {plan.rendezvous_timeout:g} s. "
            f"Start node 0 (node_rank=0) with the same master_addr, use_port and num_nodes, "
            f"and check that the port is reachable from this node."
        ) from error
