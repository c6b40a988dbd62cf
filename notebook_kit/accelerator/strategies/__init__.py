"""How the Accelerator wraps a model: one :class:`Strategy` object per way of training.

``select_strategy`` picks it once per Accelerator from the process state, the FSDP plugin and
the ``ParallelismConfig``: :class:`SingleProcess` for one process,
:class:`DistributedDataParallelStrategy` for several, :class:`FullyShardedStrategy` (FSDP2,
``torch.distributed.fsdp.fully_shard``) when an ``fsdp_plugin`` asks for it, and
``ParallelStrategy`` (HSDP, tensor and context parallel on one device mesh) for a
``ParallelismConfig``. Part of :mod:`notebook_kit.accelerator`, whose imports it follows.
"""

from __future__ import annotations

import os
from typing import Any

from notebook_kit.accelerator.collective_guard import CollectiveGuard
from notebook_kit.accelerator.handlers import Handlers
from notebook_kit.accelerator.parallelism_config import ParallelismConfig, adopt_parallelism
from notebook_kit.accelerator.partial_state import PartialState
from notebook_kit.accelerator.precision import MixedPrecision
from notebook_kit.accelerator.state import resolve_setting
from notebook_kit.accelerator.strategies.ddp import DistributedDataParallelStrategy
from notebook_kit.accelerator.strategies.single import SingleProcess
from notebook_kit.accelerator.strategies.strategy import CheckpointParts, Strategy
from notebook_kit.config.schema import SETTINGS

__all__ = [
    "CheckpointParts",
    "DistributedDataParallelStrategy",
    "SingleProcess",
    "Strategy",
    "fsdp_from_settings",
    "parallelism_from_settings",
    "select_strategy",
]


def fsdp_from_settings(plugin: Any) -> Any:
    """The FSDP plugin to use: the one given, else one from the environment, else None.

    The launch's ``fsdp=True`` (``NOTEBOOK_KIT_USE_FSDP=yes`` in its workers, also set by
    ``notebook-kit launch --use-fsdp``, read as the launch setting is) or
    ``ACCELERATE_USE_FSDP=true`` (Accelerate's own variable, as its launcher sets it) turns
    FSDP on, the plugin's fields read from the ``FSDP_*`` variables.
    """
    if plugin is not None:
        return plugin
    accelerate_says = os.environ.get("ACCELERATE_USE_FSDP", "").strip().lower()  # Accelerate's
    if resolve_setting("use_fsdp", None, None) or accelerate_says in ("1", "true", "yes"):
        from notebook_kit.accelerator.strategies.fsdp_plugin import FullyShardedDataParallelPlugin

        return FullyShardedDataParallelPlugin()
    return None


def parallelism_from_settings(config: Any) -> ParallelismConfig | None:
    """The ParallelismConfig to use: the one given (Accelerate's becomes ours), else one from
    the launch's sizes (``NOTEBOOK_KIT_PARALLELISM_CONFIG_*``) when any is above 1, or when
    ``ACCELERATE_USE_PARALLELISM_CONFIG=true`` (Accelerate's launcher), else None.

    Example:
        >>> parallelism_from_settings(None) is None
        True
    """
    config = adopt_parallelism(config)
    if config is not None:
        return config
    accelerate_says = os.environ.get("ACCELERATE_USE_PARALLELISM_CONFIG", "").strip().lower()
    launched = any(
        resolve_setting(name, None, None) > 1
        for name in SETTINGS
        if name.startswith("parallelism_config_")
    )
    return ParallelismConfig() if launched or accelerate_says == "true" else None


def select_strategy(
    state: PartialState,
    mixed_precision: MixedPrecision,
    handlers: Handlers,
    fsdp_plugin: Any = None,
    parallelism: ParallelismConfig | None = None,
) -> Strategy:
    """The strategy for this process: a ParallelismConfig's mesh when one is given (HSDP, TP,
    CP), FSDP2 when a plugin is given, else DDP or one process.

    A config whose sizes are all 1 asks for nothing: FSDP over every rank with a plugin (its
    ``dp_shard_size`` becomes the world size, as Accelerate's data-parallel default), else DDP.

    Example:
        >>> select_strategy(PartialState(cpu=True), "no", Handlers()).distributed_type
        <DistributedType.NO: 'NO'>
    """
    guard = CollectiveGuard(state.process_index, state.num_processes)
    if parallelism is not None and parallelism.total_size == 1 and state.num_processes > 1:
        if fsdp_plugin is not None:
            parallelism.dp_shard_size = state.num_processes
        else:
            parallelism = None
    if parallelism is not None and parallelism.total_size * state.num_processes > 1:
        from notebook_kit.accelerator.strategies.parallel import (
            ParallelStrategy,
            check_context_parallel_device,
        )

        parallelism.check_world(state.num_processes, fsdp_plugin is not None)
        check_context_parallel_device(state.device, parallelism.cp_size)
        return ParallelStrategy(parallelism, fsdp_plugin, state, mixed_precision, handlers, guard)
    if fsdp_plugin is not None:
        from notebook_kit.accelerator.strategies.fsdp import FullyShardedStrategy

        return FullyShardedStrategy(fsdp_plugin, state, mixed_precision, handlers, guard)
    if state.num_processes > 1:
        return DistributedDataParallelStrategy(mixed_precision, state.device, handlers, guard)
    return SingleProcess(mixed_precision, state.device, handlers)
