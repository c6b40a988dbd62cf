"""The process group of a process that torchrun (or any launcher setting RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT) started, created from those variables.

Forked workers form theirs through :mod:`notebook_kit.worker.rendezvous` instead.
"""

from __future__ import annotations

import atexit
import gc
import os
from datetime import timedelta

import torch.distributed as dist

from notebook_kit.config.cluster import DEFAULT_MASTER_PORT

__all__ = ["init_group_from_environment"]


def init_group_from_environment(backend: str, timeout: timedelta = timedelta(minutes=30)) -> None:
    """Create the default group from torchrun-style variables (RANK, WORLD_SIZE, MASTER_*).

    torchrun's agent keeps one store across restarts, so the keys a failed attempt left there
    (the dead workers' gloo addresses) would be read again by the next attempt: every attempt
    gets its own key prefix.
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
    dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world_size)
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
