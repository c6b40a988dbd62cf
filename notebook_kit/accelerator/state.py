"""Where this process stands in the job, and settings inherited from the launch or environment.

Resolved once per Accelerator from, in order: the active notebook launch, a torchrun-style
environment (the default process group is then created here), an ``srun`` task (its SLURM
variables are turned into torch's first), or a plain single process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from notebook_kit.config.placement import slurm_process_environment
from notebook_kit.config.schema import SETTINGS, parse_text
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.process_group import init_group_from_environment

__all__ = ["ProcessState", "resolve_process_state", "resolve_setting"]

T = TypeVar("T")


@dataclass(frozen=True)
class ProcessState:
    """Rank, world size and device of this process (plain data, one per Accelerator)."""

    process_index: int
    local_process_index: int
    num_processes: int
    device: torch.device


def _torchrun_environment() -> bool:
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _leave_group() -> None:
    """At exit, end the group this process made. Left to the interpreter's shutdown, torch's
    threads for it are destroyed still running, which aborts the process ("terminate called
    without an active exception") after its work is done."""
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def resolve_process_state(cpu: bool) -> ProcessState:
    """Find (or, under torchrun, create) the process group this process belongs to.

    Example:
        >>> resolve_process_state(cpu=True).num_processes  # a plain process
        1
    """
    launch = current_launch()
    if launch is not None:
        # The launcher already chose the hardware; asking CUDA again here is not needed.
        use_cuda = not cpu and launch.device == "cuda"
    else:
        use_cuda = not cpu and torch.cuda.is_available()
    initialised = dist.is_available() and dist.is_initialized()
    if launch is None and not initialised:
        # A script started by srun, one task per process: torch's env:// reads these names.
        for name, value in slurm_process_environment().items():
            os.environ.setdefault(name, value)
    if launch is not None:
        rank, local_rank, size = launch.rank, launch.local_rank, launch.world_size
    elif initialised or _torchrun_environment():
        if not initialised:  # the device first: nccl binds the group to it
            env_local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
            device = torch.device("cuda", env_local_rank) if use_cuda else None
            init_group_from_environment("nccl" if use_cuda else "gloo", device=device)
            atexit.register(_leave_group)
        rank, size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
    else:
        return ProcessState(0, 0, 1, torch.device("cuda" if use_cuda else "cpu"))
    if size > 1 and not dist.is_initialized():
        raise RuntimeError(
            f"This is rank {rank} of {size}, but no torch.distributed process group exists. "
            "Start the function with notebook_launcher or torchrun."
        )
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    return ProcessState(rank, local_rank, size, device)


def resolve_setting(name: str, explicit: T | None, launched: T | None) -> T:
    """The first given of: the explicit argument, the launch's value, the environment, a default.

    The variable's name, how its text is read and the default are the launch setting's own, from
    :data:`~notebook_kit.config.schema.SETTINGS`, so a worker reads ``NOTEBOOK_KIT_<NAME>``
    exactly as ``notebook_launcher`` and ``notebook-kit launch`` do.

    Example:
        >>> resolve_setting("mixed_precision", None, None)
        'no'
    """
    if explicit is not None:
        return explicit
    if launched is not None:
        return launched
    setting = SETTINGS[name]
    raw = os.environ.get(setting.env_var, "")
    if not raw.strip():
        return setting.default
    try:
        return parse_text(name, raw)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"Environment variable {setting.env_var}={raw!r} is not valid: {error}"
        ) from error
