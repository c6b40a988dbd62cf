"""What ``Accelerator(kwargs_handlers=[...])`` does with each handler.

One handler of each kind at most, notebook_kit's or Accelerate's own, as in Accelerate:
``DistributedDataParallelKwargs`` reaches the DDP wrapper, ``GradScalerKwargs`` the fp16 loss
scaler, ``AutocastKwargs`` every autocast region, ``ProfileKwargs`` ``accelerator.profile()``,
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

from notebook_kit.accelerator.accelerate_objects import adopt, is_accelerates
from notebook_kit.accelerator.configuration import (
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
)
from notebook_kit.accelerator.profiling import ProfileKwargs

__all__ = ["Handlers", "apply_process_group_options", "register_comm_hook", "sort_handlers"]

_KINDS: dict[type, str] = {
    DistributedDataParallelKwargs: "ddp",
    GradScalerKwargs: "scaler",
    InitProcessGroupKwargs: "init",
    AutocastKwargs: "autocast",
    ProfileKwargs: "profile",
}


@dataclass(frozen=True)
class Handlers:
    """The ``kwargs_handlers`` given to one Accelerator, by kind (None: not given)."""

    ddp: DistributedDataParallelKwargs | None = None
    scaler: GradScalerKwargs | None = None
    init: InitProcessGroupKwargs | None = None
    autocast: AutocastKwargs | None = None
    profile: ProfileKwargs | None = None

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
    for given in handlers or ():
        handler = _adopted(given)
        kind = _KINDS.get(type(handler))
        if kind is None:
            known = ", ".join(sorted(cls.__name__ for cls in _KINDS))
            if is_accelerates(handler):
                raise TypeError(
                    f"kwargs_handlers: notebook_kit has no equivalent of Accelerate's "
                    f"{type(handler).__name__}; it takes {known} (Accelerate's or its own)."
                )
            raise TypeError(
                f"kwargs_handlers takes {known} objects, from notebook_kit or Accelerate, got "
                f"{type(handler).__name__}."
            )
        if kind in found:
            raise ValueError(f"kwargs_handlers has more than one {type(handler).__name__}.")
        found[kind] = handler
    return Handlers(**found)


def _adopted(handler: Any) -> Any:
    """Accelerate's handler of a kind notebook_kit has, as notebook_kit's (field by field)."""
    for cls in _KINDS:
        if is_accelerates(handler, cls.__name__):
            return adopt(handler, cls, "kwargs_handlers")
    return handler


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
