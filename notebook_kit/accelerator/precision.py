"""Mixed precision: autocast around a prepared model's forward, outputs back in float32."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import nn

from notebook_kit.accelerator.operations import recursively_apply

__all__ = ["AutocastModule", "autocast_context", "make_grad_scaler", "patch_forward"]

MixedPrecision = Literal["no", "fp16", "bf16"]
MIXED_PRECISION_CHOICES: tuple[str, ...] = ("no", "fp16", "bf16")
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def autocast_context(mixed_precision: MixedPrecision, device: torch.device, **options: Any) -> Any:
    """``torch.autocast`` for the setting, or a no-op context for ``"no"``.

    ``options`` are ``AutocastKwargs`` fields (``enabled``, ``cache_enabled``).

    Example:
        >>> with autocast_context("bf16", torch.device("cpu")):
        ...     torch.ones(2, 2) @ torch.ones(2, 2)
    """
    if mixed_precision == "no":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[mixed_precision], **options)


def _to_float32(outputs: Any) -> Any:
    def convert(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor

    return recursively_apply(convert, outputs)


def _autocast_call(
    function: Callable[..., Any],
    mixed_precision: MixedPrecision,
    device: torch.device,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    with autocast_context(mixed_precision, device):
        outputs = function(*args, **kwargs)
    # Losses computed outside the model then run in float32, as with Accelerate.
    return _to_float32(outputs)


def _autocast_forward(
    forward: Callable[..., Any], mixed_precision: MixedPrecision, device: torch.device
) -> Callable[..., Any]:
    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return _autocast_call(forward, mixed_precision, device, args, kwargs)

    return wrapped


class AutocastModule(nn.Module):
    """Runs ``module``'s forward under autocast without touching the module object itself.

    Used on one process; with several the DistributedDataParallel wrapper gets the autocast.
    """

    def __init__(self, module: nn.Module, mixed_precision: MixedPrecision, device: torch.device):
        super().__init__()
        self.module = module
        self.mixed_precision = mixed_precision
        self.device = device

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _autocast_call(self.module, self.mixed_precision, self.device, args, kwargs)


def patch_forward(module: nn.Module, mixed_precision: MixedPrecision, device: torch.device) -> None:
    """Put autocast around the forward of a wrapper we created (never the user's module)."""
    # An instance attribute shadows the class's forward; nn.Module.__call__ looks it up.
    module.forward = _autocast_forward(module.forward, mixed_precision, device)


def make_grad_scaler(mixed_precision: MixedPrecision, device: torch.device, **options: Any) -> Any:
    """A GradScaler for fp16 (loss scaling avoids float16 gradient underflow), else None.

    ``options`` are ``GradScalerKwargs`` fields (``init_scale``, ``growth_interval``, ...).
    """
    if mixed_precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type, **options)
