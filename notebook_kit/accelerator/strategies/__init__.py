"""How the Accelerator wraps a model: one :class:`Strategy` object per way of training.

``select_strategy`` picks it once per Accelerator from the process state and the FSDP plugin:
:class:`SingleProcess` for one process, :class:`DistributedDataParallelStrategy` for several,
:class:`FullyShardedStrategy` (FSDP2, ``torch.distributed.fsdp.fully_shard``) when an
``fsdp_plugin`` asks for it. Part of :mod:`notebook_kit.accelerator`, whose imports it follows.
"""

from __future__ import annotations

import os
from typing import Any

from notebook_kit.accelerator.collective_guard import CollectiveGuard
from notebook_kit.accelerator.handlers import Handlers
from notebook_kit.accelerator.partial_state import PartialState
from notebook_kit.accelerator.precision import MixedPrecision
from notebook_kit.accelerator.state import resolve_setting
from notebook_kit.accelerator.strategies.ddp import DistributedDataParallelStrategy
from notebook_kit.accelerator.strategies.single import SingleProcess
from notebook_kit.accelerator.strategies.strategy import CheckpointParts, Strategy

__all__ = [
    "CheckpointParts",
    "DistributedDataParallelStrategy",
    "SingleProcess",
    "Strategy",
    "fsdp_from_settings",
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


def select_strategy(
    state: PartialState,
    mixed_precision: MixedPrecision,
    handlers: Handlers,
    fsdp_plugin: Any = None,
) -> Strategy:
    """The strategy for this process: FSDP2 when a plugin is given, else DDP or one process.

    Example:
        >>> select_strategy(PartialState(cpu=True), "no", Handlers()).distributed_type
        <DistributedType.NO: 'NO'>
    """
    guard = CollectiveGuard(state.process_index, state.num_processes)
    if fsdp_plugin is not None:
        from notebook_kit.accelerator.strategies.fsdp import FullyShardedStrategy

        return FullyShardedStrategy(fsdp_plugin, state, mixed_precision, handlers, guard)
    if state.num_processes > 1:
        return DistributedDataParallelStrategy(mixed_precision, state.device, handlers, guard)
    return SingleProcess(mixed_precision, state.device, handlers)
