"""Forming the process group inside a worker, with a bounded wait for the other ranks.

Rank 0 of node 0 serves a ``TCPStore`` on the socket its kernel bound before forking; every
other rank connects to it. Before the group is created, all ranks check in on the store, so a
node that never arrives ends the launch with a clear error after ``rendezvous_timeout``
instead of hanging for torch's 30-minute default.
"""

from __future__ import annotations

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
]

_JOINED_KEY = "notebook_kit/joined"
_ALL_JOINED_KEY = "notebook_kit/all_joined"
_READY_KEY = "notebook_kit/ready"
_ALL_READY_KEY = "notebook_kit/all_ready"
_FINISHED_KEY = "notebook_kit/finished"
_ALL_FINISHED_KEY = "notebook_kit/all_finished"
# The store's host waits this long for slower ranks to finish (the kernel stops it sooner
# if any rank fails).
_FINISH_WAIT = timedelta(days=7)


class RendezvousTimeout(RuntimeError):
    """Not every rank of the job joined within the rendezvous timeout."""


def join_process_group(spec: WorkerSpec) -> dist.TCPStore:
    """Connect to the store, wait for every rank, and initialise the default group."""
    store = _connect_store(spec)
    if spec.plan.num_nodes > 1:  # on one node the kernel forked every rank and sees any death
        _wait_for_other_nodes(store, spec)
    device_id = None
    if spec.plan.backend == "nccl":
        torch.cuda.set_device(spec.local_rank)
        device_id = torch.device("cuda", spec.local_rank)
    dist.init_process_group(
        spec.plan.backend,
        store=store,
        rank=spec.rank,
        world_size=spec.plan.world_size,
        device_id=device_id,
    )
    # A rank's init can return before its peers have finished their handshake with it; had
    # it crashed right away, theirs would fail too. Nobody starts until everybody is ready.
    _check_in(store, spec, _READY_KEY, _ALL_READY_KEY)
    store.wait([_ALL_READY_KEY], timedelta(seconds=spec.plan.rendezvous_timeout))
    return store


def _wait_for_other_nodes(store: dist.TCPStore, spec: WorkerSpec) -> None:
    plan = spec.plan
    _check_in(store, spec, _JOINED_KEY, _ALL_JOINED_KEY)
    try:
        store.wait([_ALL_JOINED_KEY], timedelta(seconds=plan.rendezvous_timeout))
    except (dist.DistError, RuntimeError) as error:
        raise RendezvousTimeout(
            f"Only {store.add(_JOINED_KEY, 0)} of {plan.world_size} processes joined the "
            f"rendezvous within {plan.rendezvous_timeout:g} s (num_nodes={plan.num_nodes}). "
            f"Start the launch on every node with the same num_nodes, num_processes, "
            f"master_addr and use_port."
        ) from error


def leave_process_group(store: dist.TCPStore, spec: WorkerSpec) -> None:
    """Tear the group down; the rank hosting the store stays until every rank is done.

    The store lives in that rank's process: leaving early would cut off ranks that are still
    finishing (even still completing their gloo handshake).
    """
    _check_in(store, spec, _FINISHED_KEY, _ALL_FINISHED_KEY)
    if spec.listen_fd is not None:
        store.wait([_ALL_FINISHED_KEY], _FINISH_WAIT)
    if dist.is_initialized():  # the function may have destroyed it already
        dist.destroy_process_group()


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


def _check_in(store: dist.TCPStore, spec: WorkerSpec, counter: str, all_in: str) -> None:
    """Count this rank in; the last one to arrive announces that everyone has."""
    if store.add(counter, 1) == spec.plan.world_size:
        store.set(all_in, "1")
