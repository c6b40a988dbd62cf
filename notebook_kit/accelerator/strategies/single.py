"""The single-process strategy: the model is trained as it is (mixed precision aside)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from notebook_kit.accelerator.handlers import Handlers
from notebook_kit.accelerator.partial_state import DistributedType
from notebook_kit.accelerator.precision import MixedPrecision, make_grad_scaler, patch_forward
from notebook_kit.accelerator.strategies.strategy import CheckpointParts, clip_plain

__all__ = ["SingleProcess"]


class SingleProcess:
    """One process: ``wrap`` returns the user's module itself, so its type and methods stay.

    With mixed precision its forward runs under autocast (outputs back in float32).
    """

    distributed_type = DistributedType.NO
    can_join = False
    times_collectives = False

    def __init__(self, mixed_precision: MixedPrecision, device: torch.device, handlers: Handlers):
        self.mixed_precision = mixed_precision
        self.device = device
        self.handlers = handlers

    def wrap(self, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> nn.Module:
        self.patch_precision(model)
        return model

    def patch_precision(self, model: nn.Module) -> None:
        """Run ``model``'s forward under autocast when mixed precision is on."""
        if self.mixed_precision != "no":
            autocast = self.handlers.autocast_options()
            patch_forward(model, self.mixed_precision, self.device, **autocast)

    def grad_scaler(self, options: dict[str, Any]) -> Any:
        return make_grad_scaler(self.mixed_precision, self.device, **options)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def trigger_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def clip_grad_norm(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> Any:
        return clip_plain(parameters, max_norm, norm_type)

    def full_state_dict(self, model: nn.Module, call: str) -> dict[str, Any]:
        return self.unwrap(model).state_dict()

    def checkpoint_parts(
        self, models: Sequence[nn.Module], optimizers: Sequence[Any]
    ) -> CheckpointParts:
        return CheckpointParts(models=[self.unwrap(m) for m in models], optimizers=optimizers)

    def enter_collective(self, call: str) -> None:
        """Nothing to check: a single process is always all of them."""
