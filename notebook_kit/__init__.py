"""notebook_kit: distributed PyTorch training from a Jupyter notebook.

The public names are imported on first use (PEP 562), so a light entry point such as the
``notebook-kit`` command does not pay for torch or ipywidgets until it needs them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# The two changes importing the package makes to the process, on purpose: the launcher forks
# workers from the kernel, and each keeps a fork safe. Notebook code runs between
# `import notebook_kit` and the launch, so the launch itself would be too late to set either.
# A value the user set is kept. tests/test_import.py checks that importing changes nothing
# else in os.environ or sys.meta_path.
# - A process that has initialised the CUDA driver cannot fork children that use the GPU.
#   torch.cuda.is_available() initialises the driver unless this variable (read at each call)
#   makes it ask NVML instead.
# - gRPC (a Ray client's connection, among others) starts threads of its own in every child
#   that a process holding gRPC threads forks, unless its fork support is off; they sometimes
#   crash the child, a worker, before it runs a line. gRPC reads the variable when it starts,
#   at its first connection, so it holds for a Ray connection made after this import. No
#   forked worker uses the kernel's gRPC, which is all the support is for.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from notebook_kit.config.environment import environment
from notebook_kit.lazy_names import lazy_names

if TYPE_CHECKING:
    from notebook_kit.accelerator.accelerator import Accelerator
    from notebook_kit.accelerator.batch_size import find_executable_batch_size
    from notebook_kit.accelerator.checkpointing import CheckpointError
    from notebook_kit.accelerator.configuration import (
        AutocastKwargs,
        DataLoaderConfiguration,
        DDPCommunicationHookType,
        DistributedDataParallelKwargs,
        GradientAccumulationPlugin,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        KwargsHandler,
        ProjectConfiguration,
    )
    from notebook_kit.accelerator.data_loader import prepare_data_loader, skip_first_batches
    from notebook_kit.accelerator.operations import (
        DistributedOperationException,
        broadcast,
        broadcast_object_list,
        gather,
        gather_object,
        pad_across_processes,
        reduce,
        send_to_device,
    )
    from notebook_kit.accelerator.parallelism_config import ParallelismConfig
    from notebook_kit.accelerator.partial_state import (
        AcceleratorState,
        DistributedType,
        PartialState,
    )
    from notebook_kit.accelerator.profiling import ProfileKwargs
    from notebook_kit.accelerator.strategies.fsdp_plugin import FullyShardedDataParallelPlugin
    from notebook_kit.config.launch_config import LaunchConfig
    from notebook_kit.errors import PortInUseError, WorkerError
    from notebook_kit.launch.cluster.engines.dask_local import local_cluster
    from notebook_kit.launch.launcher import notebook_launcher, notebook_launcher_async
    from notebook_kit.launch.panel import ConfigPanel
    from notebook_kit.launch.pool.worker_pool import WorkerPool
    from notebook_kit.launch.preflight import ForkSafetyError
    from notebook_kit.launch.profile_requests import profile
    from notebook_kit.launch.stack_requests import stacks
    from notebook_kit.launch.template_choice import get_start_method, set_start_method
    from notebook_kit.live.record import RunRecord, last_run
    from notebook_kit.runtime.loop import (
        log,
        progress,
        set_flops_per_sample,
        should_stop,
        stop_reason,
    )
    from notebook_kit.runtime.seeding import set_seed, synchronize_rng_states

__all__ = [
    "Accelerator",
    "AcceleratorState",
    "AutocastKwargs",
    "CheckpointError",
    "ConfigPanel",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "ForkSafetyError",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LaunchConfig",
    "ParallelismConfig",
    "PartialState",
    "PortInUseError",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RunRecord",
    "WorkerError",
    "WorkerPool",
    "broadcast",
    "broadcast_object_list",
    "environment",
    "find_executable_batch_size",
    "gather",
    "gather_object",
    "get_start_method",
    "last_run",
    "local_cluster",
    "log",
    "notebook_launcher",
    "notebook_launcher_async",
    "pad_across_processes",
    "prepare_data_loader",
    "profile",
    "progress",
    "reduce",
    "send_to_device",
    "set_flops_per_sample",
    "set_seed",
    "set_start_method",
    "should_stop",
    "skip_first_batches",
    "stacks",
    "stop_reason",
    "synchronize_rng_states",
]

__version__ = "0.1.0"

# Public name -> the submodule that defines it.
_LAZY: dict[str, str] = {
    "Accelerator": "accelerator.accelerator",
    "AcceleratorState": "accelerator.partial_state",
    "AutocastKwargs": "accelerator.configuration",
    "CheckpointError": "accelerator.checkpointing",
    "ConfigPanel": "launch.panel",
    "DDPCommunicationHookType": "accelerator.configuration",
    "DataLoaderConfiguration": "accelerator.configuration",
    "DistributedDataParallelKwargs": "accelerator.configuration",
    "DistributedOperationException": "accelerator.operations",
    "DistributedType": "accelerator.partial_state",
    "ForkSafetyError": "launch.preflight",
    "FullyShardedDataParallelPlugin": "accelerator.strategies.fsdp_plugin",
    "ParallelismConfig": "accelerator.parallelism_config",
    "GradScalerKwargs": "accelerator.configuration",
    "GradientAccumulationPlugin": "accelerator.configuration",
    "InitProcessGroupKwargs": "accelerator.configuration",
    "KwargsHandler": "accelerator.configuration",
    "LaunchConfig": "config.launch_config",
    "PartialState": "accelerator.partial_state",
    "PortInUseError": "errors",
    "ProfileKwargs": "accelerator.profiling",
    "ProjectConfiguration": "accelerator.configuration",
    "RunRecord": "live.record",
    "WorkerError": "errors",
    "WorkerPool": "launch.pool.worker_pool",
    "broadcast": "accelerator.operations",
    "broadcast_object_list": "accelerator.operations",
    "find_executable_batch_size": "accelerator.batch_size",
    "gather": "accelerator.operations",
    "gather_object": "accelerator.operations",
    "get_start_method": "launch.template_choice",
    "last_run": "live.record",
    "local_cluster": "launch.cluster.engines.dask_local",
    "log": "runtime.loop",
    "notebook_launcher": "launch.launcher",
    "notebook_launcher_async": "launch.launcher",
    "pad_across_processes": "accelerator.operations",
    "prepare_data_loader": "accelerator.data_loader",
    "profile": "launch.profile_requests",
    "progress": "runtime.loop",
    "reduce": "accelerator.operations",
    "send_to_device": "accelerator.operations",
    "set_seed": "runtime.seeding",
    "set_start_method": "launch.template_choice",
    "set_flops_per_sample": "runtime.loop",
    "should_stop": "runtime.loop",
    "skip_first_batches": "accelerator.data_loader",
    "stacks": "launch.stack_requests",
    "stop_reason": "runtime.loop",
    "synchronize_rng_states": "runtime.seeding",
}


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext notebook_kit``: adds the ``%%distributed`` cell magic (``launch/magic.py``)."""
    from notebook_kit.launch.magic import load_ipython_extension as load

    load(ipython)


__getattr__, __dir__ = lazy_names(__name__, _LAZY)


def _start_template_in_a_kernel() -> None:
    """In a kernel, the clean process that starts workers when the kernel can no longer fork
    safely is made now, before the notebook's code runs, so the launch that needs it finds it
    ready (launch/template_start.py says where and why not; start_method="fork" opts out)."""
    from notebook_kit.launch.template_choice import get_start_method
    from notebook_kit.launch.template_start import start_at_import

    start_at_import(get_start_method)


_start_template_in_a_kernel()
del _start_template_in_a_kernel
