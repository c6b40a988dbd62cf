"""Mixed precision: autocast around a prepared model's forward, outputs back in float32."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from notebook_kit.accelerator.operations import recursively_apply
from notebook_kit.config.arguments import MixedPrecision
from notebook_kit.config.schema import SETTINGS

__all__ = [
    "HALF_DTYPES",
    "MIXED_PRECISION_CHOICES",
    "AutocastForward",
    "MixedPrecision",
    "autocast_context",
    "make_grad_scaler",
    "patch_forward",
    "restore_forward",
]

# The words are the launch setting's (one declaration, in the schema); only their dtypes are ours.
MIXED_PRECISION_CHOICES: tuple[str, ...] = SETTINGS["mixed_precision"].choices
HALF_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16}


def autocast_context(mixed_precision: MixedPrecision, device: torch.device, **options: Any) -> Any:
    """``torch.autocast`` for the setting, or a no-op context for ``"no"``.

    ``options`` are ``AutocastKwargs`` fields (``enabled``, ``cache_enabled``).

    Example::

        with autocast_context("bf16", torch.device("cpu")):
            torch.ones(2, 2) @ torch.ones(2, 2)
    """
    if mixed_precision == "no":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=HALF_DTYPES[mixed_precision], **options)


def _to_float32(outputs: Any) -> Any:
    def convert(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor

    return recursively_apply(convert, outputs)


class AutocastForward:
    """A module's own forward run under autocast, outputs back in float32.

    Set as an instance attribute, it shadows the class's ``forward`` (``nn.Module.__call__``
    looks it up there), so the prepared model stays the user's object: its attributes,
    methods and type are untouched. A class, not a closure, so the module still pickles.
    ``options`` are ``AutocastKwargs`` fields.
    """

    def __init__(
        self,
        forward: Callable[..., Any],
        mixed_precision: MixedPrecision,
        device: torch.device,
        **options: Any,
    ) -> None:
        self.original = forward
        self.mixed_precision = mixed_precision
        self.device = device
        self.options = options
        functools.update_wrapper(self, forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with autocast_context(self.mixed_precision, self.device, **self.options):
            outputs = self.original(*args, **kwargs)
        # Losses computed outside the model then run in float32, as with Accelerate.
        return _to_float32(outputs)


def patch_forward(
    module: nn.Module, mixed_precision: MixedPrecision, device: torch.device, **options: Any
) -> None:
    """Run ``module``'s forward under autocast from now on (again: the setting is replaced).

    Example::

        patch_forward(model, "bf16", torch.device("cpu")); model(x).dtype
        # torch.float32
    """
    restore_forward(module)
    module.forward = AutocastForward(module.forward, mixed_precision, device, **options)


def restore_forward(module: nn.Module) -> nn.Module:
    """Undo :func:`patch_forward`: the module's forward is the one it had before."""
    patched = module.__dict__.get("forward")
    if isinstance(patched, AutocastForward):
        del module.forward
        if getattr(patched.original, "__self__", None) is not module:
            module.forward = patched.original  # the user had set a forward of their own
    return module


def make_grad_scaler(mixed_precision: MixedPrecision, device: torch.device, **options: Any) -> Any:
    """A GradScaler for fp16 (loss scaling avoids float16 gradient underflow), else None.

    ``options`` are ``GradScalerKwargs`` fields (``init_scale``, ``growth_interval``, ...).
    """
    if mixed_precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type, **options)
