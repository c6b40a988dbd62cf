"""The DDP strategy: every rank holds the whole model; gradients are all-reduced in backward."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from notebook_kit.accelerator.collective_guard import CollectiveGuard
from notebook_kit.accelerator.handlers import Handlers, register_comm_hook
from notebook_kit.accelerator.partial_state import DistributedType
from notebook_kit.accelerator.precision import MixedPrecision
from notebook_kit.accelerator.strategies.single import SingleProcess

__all__ = ["DistributedDataParallelStrategy"]


class DistributedDataParallelStrategy(SingleProcess):
    """Several processes, each with a full replica in ``DistributedDataParallel``.

    A module without trainable parameters is left unwrapped (DDP refuses it); under DDP
    ``prepared.module`` is the user's module.
    """

    can_join = True
    times_collectives = True

    def __init__(
        self,
        mixed_precision: MixedPrecision,
        device: torch.device,
        handlers: Handlers,
        guard: CollectiveGuard,
    ) -> None:
        super().__init__(mixed_precision, device, handlers)
        self.guard = guard
        self.distributed_type = (
            DistributedType.MULTI_GPU if device.type == "cuda" else DistributedType.MULTI_CPU
        )

    def wrap(self, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> nn.Module:
        wrapped = model
        if any(parameter.requires_grad for parameter in model.parameters()):
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            options = self.handlers.ddp_options()
            wrapped = DistributedDataParallel(model, device_ids=device_ids, **options)
            register_comm_hook(self.handlers.ddp, wrapped)
        self.patch_precision(wrapped)
        return wrapped

    def unwrap(self, model: nn.Module) -> nn.Module:
        while isinstance(model, DistributedDataParallel):
            model = model.module
        return model

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def trigger_sync(self, model: nn.Module) -> Iterator[None]:
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        saved = (model.require_backward_grad_sync, model.require_forward_param_sync)
        model.require_backward_grad_sync = True
        model.require_forward_param_sync = True
        # A forward under no_sync left DDP's reducer unprepared; preparing it now makes the
        # coming backward reduce every bucket.
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = saved

    def enter_collective(self, call: str) -> None:
        self.guard.enter(call)
