"""The process group of a process that torchrun (or any launcher setting RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT) started, created from those variables; and the one CPU group
kept beside an nccl group.

Forked workers form theirs through :mod:`notebook_kit.worker.rendezvous` instead.
"""

from __future__ import annotations

import atexit
import gc
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from notebook_kit.config.placement import DEFAULT_MASTER_PORT

__all__ = ["cpu_group", "init_group_from_environment"]


def init_group_from_environment(
    backend: str,
    timeout: timedelta = timedelta(minutes=30),
    device: torch.device | None = None,
) -> None:
    """Create the default group from torchrun-style variables (RANK, WORLD_SIZE, MASTER_*).

    torchrun's agent keeps one store across restarts, so the keys a failed attempt left there
    (the dead workers' gloo addresses) would be read again by the next attempt: every attempt
    gets its own key prefix. ``device`` (this rank's GPU, under nccl) is made current first
    and bound to the group, so NCCL never guesses the device from the rank and no context is
    opened on GPU 0 by the ranks that do not own it.
    """
    environ = os.environ
    rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    hosted_by_agent = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        environ["MASTER_ADDR"],
        int(environ.get("MASTER_PORT", str(DEFAULT_MASTER_PORT))),
        world_size,
        is_master=rank == 0 and not hosted_by_agent,
        timeout=timeout,
    )
    attempt = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefixed = dist.PrefixStore(f"notebook_kit/attempt_{attempt}", store)
    bound = {}
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)
        bound["device_id"] = device
    dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world_size, **bound)
    atexit.register(_release_group_before_exit)


def _release_group_before_exit() -> None:
    """Destroy the group while the interpreter is still whole.

    Otherwise gloo's worker thread may drop its last reference to a finished collective (and
    its tensors) during interpreter shutdown; taking the GIL then ends that thread inside a
    destructor and aborts the process ("terminate called without an active exception").
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()  # frees work objects still held through Python references


# One gloo group beside each nccl default group, for the small CPU collectives the stop vote
# and the pool's health check make. A group is never freed before destroy_process_group, so
# one per launch context (a pool makes one per cell) would pile up: it is made once and reused.
_cpu_groups: dict[int, tuple[Any, Any]] = {}  # id(default group) -> (default group, gloo group)


def _needs_cpu_group() -> bool:
    """True when the default group cannot reduce CPU tensors (nccl)."""
    return dist.get_backend() == "nccl"


def cpu_group() -> Any:
    """The group for small CPU collectives: None (the default group) unless that is nccl.

    The first call makes a gloo group, so every rank must make it at the same point, as for
    any collective; later calls return the same group for as long as the default group lives.

    Example::

        ballot = torch.zeros(2)
        dist.all_reduce(ballot, group=cpu_group())
    """
    if not _needs_cpu_group():
        return None
    default = dist.distributed_c10d._get_default_group()
    known = _cpu_groups.get(id(default))
    if known is not None and known[0] is default and known[1] in _live_groups():
        return known[1]
    group = dist.new_group(backend="gloo")
    _cpu_groups.clear()  # a default group that was destroyed took its gloo group with it
    _cpu_groups[id(default)] = (default, group)
    return group


def _live_groups() -> Any:
    return dist.distributed_c10d._world.pg_map
