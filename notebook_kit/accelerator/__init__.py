"""The Accelerate-compatible runtime a training function uses: :class:`Accelerator` and its parts.

Process state, data loader sharding, optimizer and scheduler wrappers, mixed precision,
collective operations, checkpoints and profiles. Names and meanings follow Hugging Face Accelerate.

Runs in every process that trains (a forked worker, the kernel with one process, or under
torchrun); it never starts or stops processes. May import :mod:`notebook_kit.integrations`
(its trackers), :mod:`notebook_kit.runtime` and :mod:`notebook_kit.config`.
"""

from notebook_kit.accelerator.accelerator import Accelerator
from notebook_kit.accelerator.batch_size import find_executable_batch_size
from notebook_kit.accelerator.configuration import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProjectConfiguration,
)
from notebook_kit.accelerator.parallelism_config import ParallelismConfig
from notebook_kit.accelerator.partial_state import AcceleratorState, DistributedType, PartialState
from notebook_kit.accelerator.profiling import ProfileKwargs
from notebook_kit.accelerator.strategies.fsdp_plugin import FullyShardedDataParallelPlugin

__all__ = [
    "Accelerator",
    "AcceleratorState",
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "ParallelismConfig",
    "PartialState",
    "ProfileKwargs",
    "ProjectConfiguration",
    "find_executable_batch_size",
]
