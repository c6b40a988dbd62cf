"""``FullyShardedDataParallelPlugin``: Accelerate's FSDP settings, for FSDP2 (``fully_shard``).

The fields keep Accelerate's names and meanings; unset fields are read from the ``FSDP_*``
environment variables Accelerate reads (``FSDP_VERSION``, ``FSDP_AUTO_WRAP_POLICY``, ...).
Accelerate's own plugin object is accepted too and read field by field; a field only FSDP1
has, set to something other than its default, is an error naming it, never silently dropped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from notebook_kit.accelerator.precision import HALF_DTYPES

if TYPE_CHECKING:  # torch.distributed.fsdp costs half a second to import: only where it is used
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

__all__ = ["FullyShardedDataParallelPlugin", "as_plugin"]

WrapPolicy = Literal["transformer_based_wrap", "size_based_wrap", "no_wrap"]
StateDictType = Literal["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
_POLICIES = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
_STATE_DICT_TYPES = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
_DTYPES = {**HALF_DTYPES, "fp32": torch.float32}  # a policy may also keep float32
# Accelerate's fields that FSDP2 has no use for: accepted only at their defaults.
_FSDP1_ONLY = (
    "sharding_strategy",
    "backward_prefetch",
    "use_orig_params",
    "param_init_fn",
    "sync_module_states",
    "forward_prefetch",
    "activation_checkpointing_offload",
)


def _env_flag(name: str) -> bool | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"Environment variable {name}={raw!r} must be true or false.")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError as error:
        raise ValueError(f"Environment variable {name}={raw!r} must be an integer.") from error


@dataclass
class FullyShardedDataParallelPlugin:
    """How ``Accelerator(fsdp_plugin=...)`` shards a model with FSDP2.

    Args:
        fsdp_version: 2 (FSDP2, ``torch.distributed.fsdp.fully_shard``); 1 is refused.
        reshard_after_forward: Free the gathered parameters after each forward (less memory,
            one more all-gather in backward).
        auto_wrap_policy: Which submodules become their own shard group, bottom-up before
            the root: ``"transformer_based_wrap"`` (classes named in
            ``transformer_cls_names_to_wrap``, else the model's ``_no_split_modules``),
            ``"size_based_wrap"`` (at least ``min_num_params`` parameters), ``"no_wrap"``
            (only the root), or a callable ``module -> bool``.
        transformer_cls_names_to_wrap: Class names for ``"transformer_based_wrap"``.
        min_num_params: Threshold for ``"size_based_wrap"``.
        mixed_precision_policy: A ``MixedPrecisionPolicy``, a dict of its fields, or
            ``"bf16"``/``"fp32"``; None follows the Accelerator's ``mixed_precision``.
        cpu_offload: Keep parameters, gradients and optimizer state in CPU memory (True or a
            ``CPUOffloadPolicy``); on a CPU run memory is not pinned.
        ignored_modules: Modules (or a regex of module names) left unsharded.
        state_dict_type: What ``save_state`` writes: ``"SHARDED_STATE_DICT"`` (DCP, each rank
            its share) or ``"FULL_STATE_DICT"`` (gathered, rank 0 writes).
        activation_checkpointing: Recompute the wrapped blocks' activations in backward.
        cpu_ram_efficient_loading: Rank 0's weights are broadcast to the others after
            sharding, so other ranks may build the model on the ``meta`` device.

    Example::

        plugin = FullyShardedDataParallelPlugin(
            auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"])
        accelerator = Accelerator(fsdp_plugin=plugin)
    """

    fsdp_version: int | None = None
    reshard_after_forward: bool | None = None
    auto_wrap_policy: WrapPolicy | Callable[[nn.Module], bool] | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None
    mixed_precision_policy: MixedPrecisionPolicy | dict[str, Any] | str | None = None
    cpu_offload: bool | CPUOffloadPolicy | None = None
    ignored_modules: Iterable[nn.Module] | str | None = None
    state_dict_type: StateDictType | None = None
    activation_checkpointing: bool | None = None
    cpu_ram_efficient_loading: bool | None = None

    def __post_init__(self) -> None:
        self._from_environment()
        if self.fsdp_version != 2:
            raise ValueError(
                f"fsdp_version={self.fsdp_version!r}: notebook_kit shards with FSDP2 "
                "(torch.distributed.fsdp.fully_shard) only; use "
                "FullyShardedDataParallelPlugin(fsdp_version=2) (or FSDP_VERSION=2)."
            )
        self._check_policy()
        if self.state_dict_type not in _STATE_DICT_TYPES:
            raise ValueError(
                f"state_dict_type must be one of {', '.join(_STATE_DICT_TYPES)}, "
                f"got {self.state_dict_type!r}."
            )
        self.mixed_precision_policy = _policy(self.mixed_precision_policy)

    def _from_environment(self) -> None:
        """Unset fields take Accelerate's ``FSDP_*`` variables, then the defaults."""
        if self.fsdp_version is None:
            self.fsdp_version = _env_int("FSDP_VERSION") or 2
        if self.reshard_after_forward is None:
            flag = _env_flag("FSDP_RESHARD_AFTER_FORWARD")
            self.reshard_after_forward = True if flag is None else flag
        if self.auto_wrap_policy is None:
            raw = os.environ.get("FSDP_AUTO_WRAP_POLICY") or "no_wrap"
            self.auto_wrap_policy = raw.lower()  # type: ignore[assignment]
        if self.transformer_cls_names_to_wrap is None:
            self.transformer_cls_names_to_wrap = os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP")
        if isinstance(self.transformer_cls_names_to_wrap, str):
            names = self.transformer_cls_names_to_wrap.split(",")
            self.transformer_cls_names_to_wrap = [name.strip() for name in names if name.strip()]
        if self.min_num_params is None:
            self.min_num_params = _env_int("FSDP_MIN_NUM_PARAMS") or 0
        if self.cpu_offload is None:
            self.cpu_offload = bool(_env_flag("FSDP_OFFLOAD_PARAMS"))
        if self.ignored_modules is None:
            self.ignored_modules = os.environ.get("FSDP_IGNORED_MODULES") or None
        if self.state_dict_type is None:
            raw = os.environ.get("FSDP_STATE_DICT_TYPE") or "SHARDED_STATE_DICT"
            self.state_dict_type = raw.upper()  # type: ignore[assignment]
        if self.activation_checkpointing is None:
            self.activation_checkpointing = bool(_env_flag("FSDP_ACTIVATION_CHECKPOINTING"))
        if self.cpu_ram_efficient_loading is None:
            flag = _env_flag("FSDP_CPU_RAM_EFFICIENT_LOADING")
            self.cpu_ram_efficient_loading = bool(flag)

    def _check_policy(self) -> None:
        policy = self.auto_wrap_policy
        if callable(policy):
            return
        if policy not in _POLICIES:
            raise ValueError(
                f"auto_wrap_policy must be one of {', '.join(map(repr, _POLICIES))} or a "
                f"callable module -> bool, got {policy!r}."
            )
        if policy == "size_based_wrap" and not self.min_num_params:
            raise ValueError(
                "auto_wrap_policy='size_based_wrap' needs min_num_params=N (> 0): the number "
                "of parameters from which a submodule gets its own shard group."
            )


def _policy(value: Any) -> MixedPrecisionPolicy | None:
    """``mixed_precision_policy`` as torch's ``MixedPrecisionPolicy`` (None: not given)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if value is None or isinstance(value, MixedPrecisionPolicy):
        return value
    if isinstance(value, str):
        if value not in _DTYPES:
            raise ValueError(
                f"mixed_precision_policy={value!r}: give 'bf16', 'fp16', 'fp32', a dict of "
                "MixedPrecisionPolicy fields or a MixedPrecisionPolicy."
            )
        dtype = _DTYPES[value]
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    if isinstance(value, dict):
        converted = {key: _DTYPES.get(item, item) for key, item in value.items()}
        try:
            return MixedPrecisionPolicy(**converted)
        except TypeError as error:
            raise ValueError(f"mixed_precision_policy={value!r}: {error}") from error
    raise TypeError(
        f"mixed_precision_policy must be a MixedPrecisionPolicy, a dict or a string, got "
        f"{type(value).__name__}."
    )


def _accelerate_policy(policy: Any) -> Any:
    """Accelerate keeps its wrap policies as FSDP1 functions: back to their names."""
    if policy is None:
        return "no_wrap"
    name = getattr(getattr(policy, "func", policy), "__name__", "")
    known = {
        "transformer_auto_wrap_policy": "transformer_based_wrap",
        "size_based_auto_wrap_policy": "size_based_wrap",
    }
    return known.get(name, policy)


def as_plugin(plugin: Any) -> FullyShardedDataParallelPlugin:
    """Our plugin from ours or from Accelerate's ``FullyShardedDataParallelPlugin``.

    Example::

        as_plugin(accelerate.utils.FullyShardedDataParallelPlugin(fsdp_version=2))
    """
    if isinstance(plugin, FullyShardedDataParallelPlugin):
        return plugin
    if type(plugin).__name__ != "FullyShardedDataParallelPlugin":
        raise TypeError(
            "fsdp_plugin must be a FullyShardedDataParallelPlugin (notebook_kit's or "
            f"Accelerate's), got {type(plugin).__module__}.{type(plugin).__qualname__}."
        )
    for name in _FSDP1_ONLY:
        value = getattr(plugin, name, None)
        if value not in (None, False):
            raise ValueError(
                f"Accelerate's FullyShardedDataParallelPlugin has {name}={value!r}, which "
                "FSDP2 does not use; leave it unset (FSDP2 always shards fully; "
                "reshard_after_forward says when to free gathered parameters)."
            )
    values = {
        field.name: getattr(plugin, field.name, None)
        for field in fields(FullyShardedDataParallelPlugin)
    }
    values["auto_wrap_policy"] = _accelerate_policy(values["auto_wrap_policy"])
    kind = values["state_dict_type"]
    values["state_dict_type"] = getattr(kind, "name", kind)
    from torch.distributed.fsdp import CPUOffloadPolicy

    offload = values["cpu_offload"]
    values["cpu_offload"] = bool(offload) if not isinstance(offload, CPUOffloadPolicy) else offload
    return FullyShardedDataParallelPlugin(**values)
