"""What ``Accelerator(kwargs_handlers=[...])`` does with each handler.

One handler of each kind at most, as in Accelerate: ``DistributedDataParallelKwargs`` reaches the
DDP wrapper, ``GradScalerKwargs`` the fp16 loss scaler, ``AutocastKwargs`` every autocast region,
and ``InitProcessGroupKwargs`` the process group (its timeout is applied to a group that already
exists; what cannot be changed afterwards is reported with the launcher option that sets it).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch import nn

from notebook_kit.accelerator.configuration import (
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
)

__all__ = ["Handlers", "apply_process_group_options", "register_comm_hook", "sort_handlers"]

_KINDS: dict[type, str] = {
    DistributedDataParallelKwargs: "ddp",
    GradScalerKwargs: "scaler",
    InitProcessGroupKwargs: "init",
    AutocastKwargs: "autocast",
}


@dataclass(frozen=True)
class Handlers:
    """The ``kwargs_handlers`` given to one Accelerator, by kind (None: not given)."""

    ddp: DistributedDataParallelKwargs | None = None
    scaler: GradScalerKwargs | None = None
    init: InitProcessGroupKwargs | None = None
    autocast: AutocastKwargs | None = None

    def ddp_options(self) -> dict[str, Any]:
        """Keyword arguments for ``DistributedDataParallel`` (the changed fields only)."""
        return self.ddp.to_kwargs() if self.ddp is not None else {}

    def scaler_options(self) -> dict[str, Any]:
        return self.scaler.to_kwargs() if self.scaler is not None else {}

    def autocast_options(self) -> dict[str, Any]:
        return self.autocast.to_kwargs() if self.autocast is not None else {}


def sort_handlers(handlers: Iterable[Any] | None) -> Handlers:
    """Check ``kwargs_handlers`` and file each by kind.

    Example:
        >>> sort_handlers([GradScalerKwargs(init_scale=1024.0)]).scaler.init_scale
        1024.0
    """
    found: dict[str, Any] = {}
    for handler in handlers or ():
        kind = _KINDS.get(type(handler))
        if kind is None:
            known = ", ".join(sorted(cls.__name__ for cls in _KINDS))
            hint = "" if isinstance(handler, KwargsHandler) else " (is it Accelerate's class?)"
            raise TypeError(
                f"kwargs_handlers takes {known} objects from notebook_kit, got "
                f"{type(handler).__name__}{hint}."
            )
        if kind in found:
            raise ValueError(f"kwargs_handlers has more than one {type(handler).__name__}.")
        found[kind] = handler
    return Handlers(**found)


def apply_process_group_options(init: InitProcessGroupKwargs | None) -> None:
    """Give the existing default process group the requested timeout; report what cannot change."""
    if init is None or not (dist.is_available() and dist.is_initialized()):
        return
    backend = str(dist.get_backend())
    if init.backend is not None and init.backend != backend and init.to_kwargs().get("backend"):
        warnings.warn(
            f"InitProcessGroupKwargs(backend={init.backend!r}) was not applied: the process group "
            f"already uses {backend!r}. Choose it with notebook_launcher(backend=...).",
            stacklevel=3,
        )
    if init.init_method is not None:
        warnings.warn(
            "InitProcessGroupKwargs(init_method=...) was not applied: the process group already "
            "exists (the launcher's rendezvous made it).",
            stacklevel=3,
        )
    if "timeout" in init.to_kwargs():
        # torch keeps the timeout per backend; this is its supported way to change it later.
        dist.distributed_c10d._set_pg_timeout(init.timeout)


def register_comm_hook(ddp: DistributedDataParallelKwargs | None, model: nn.Module) -> None:
    """Register the gradient compression hook ``ddp.comm_hook`` asks for on a DDP ``model``."""
    if ddp is None or DDPCommunicationHookType(ddp.comm_hook) == DDPCommunicationHookType.NO:
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    hooks = {
        DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
        DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
        DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
        DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
    }
    wrappers = {
        DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
        DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper,
    }
    kind = DDPCommunicationHookType(ddp.comm_hook)
    hook = hooks[kind]
    wrapper = wrappers.get(DDPCommunicationHookType(ddp.comm_wrapper))
    if wrapper is not None:
        hook = wrapper(hook)
    power_sgd = kind in (
        DDPCommunicationHookType.POWER_SGD,
        DDPCommunicationHookType.BATCHED_POWER_SGD,
    )
    state = powerSGD_hook.PowerSGDState(None, **ddp.comm_state_option) if power_sgd else None
    model.register_comm_hook(state=state, hook=hook)
