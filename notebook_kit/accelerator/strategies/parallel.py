"""The strategy of a ``ParallelismConfig``: HSDP, tensor parallel and context parallel, composed.

On one ``DeviceMesh`` with Accelerate's dimension names, ``wrap`` first splits the layers over
``tp`` (when ``tp_size`` > 1), then shards what that leaves with FSDP2 over
``(dp_replicate, dp_shard_cp)`` — a 2-D mesh is HSDP: each shard group all-gathers within
itself, and the replicas all-reduce their gradients — and hooks the attention layers for
context parallel. Everything else (accumulation, clipping, state dicts, sharded checkpoints,
weights coming home) is the FSDP2 strategy's, which works on DTensors of any mesh.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from notebook_kit.accelerator.collective_guard import CollectiveGuard
from notebook_kit.accelerator.handlers import Handlers
from notebook_kit.accelerator.parallelism_config import ParallelismConfig
from notebook_kit.accelerator.partial_state import DistributedType, PartialState
from notebook_kit.accelerator.precision import MixedPrecision
from notebook_kit.accelerator.strategies.fsdp import FullyShardedStrategy, _ShardedScaler
from notebook_kit.accelerator.strategies.fsdp_plugin import FullyShardedDataParallelPlugin
from notebook_kit.accelerator.strategies.tensor_parallel import (
    apply_tensor_parallel,
    build_device_mesh,
    fsdp_mesh,
)
from notebook_kit.config.mesh_layout import MeshLayout
from notebook_kit.runtime.context import current_launch

__all__ = ["ParallelStrategy", "check_context_parallel_device"]


def check_context_parallel_device(device: torch.device, cp_size: int) -> None:
    """Refuse context parallel off CUDA, before any mesh is built, saying what it needs."""
    if cp_size > 1 and device.type != "cuda":
        raise ValueError(
            f"ParallelismConfig(cp_size={cp_size}) needs CUDA GPUs: context parallel splits "
            "each sequence and passes keys and values around a ring inside torch's "
            "flash/efficient scaled_dot_product_attention kernels, which CPU processes do not "
            "have. Run on at least cp_size GPUs (with FSDP2 and a model using SDPA with no "
            "mask or a causal one), or set cp_size=1 here."
        )


def _launch_layout() -> MeshLayout:
    """The mesh of the launch settings (``parallelism_config_*``), which its banner shows."""
    return ParallelismConfig().layout()  # every size left out: read from the launch


class ParallelStrategy(FullyShardedStrategy):
    """HSDP, FSDP, TP and CP over the mesh of a :class:`ParallelismConfig`."""

    def __init__(
        self,
        config: ParallelismConfig,
        plugin: Any,
        state: PartialState,
        mixed_precision: MixedPrecision,
        handlers: Handlers,
        guard: CollectiveGuard,
    ) -> None:
        check_context_parallel_device(state.device, config.cp_size)
        self.config = config
        layout = config.layout()
        self.device_mesh, self.flat = build_device_mesh(state.device, layout)
        launch = current_launch()
        if launch is not None:  # a failure of this rank names its place in the mesh
            launch.mesh_coordinates = layout.where(state.process_index)
            if state.process_index == 0 and layout != _launch_layout():
                print(layout.describe(), flush=True)  # not in the launch banner: rank 0 says it
        if config.shards:
            mesh = fsdp_mesh(self.device_mesh, self.flat, config.fsdp_dim_names)
        else:
            mesh = self.device_mesh["tp"]  # TP alone: fp16's scaler agrees over it
        super().__init__(
            plugin if plugin is not None else FullyShardedDataParallelPlugin(),
            state,
            mixed_precision,
            handlers,
            guard,
            mesh=mesh,
        )
        if config.shards:
            self.distributed_type = DistributedType.FSDP
        else:
            cuda = state.device.type == "cuda"
            self.distributed_type = DistributedType.MULTI_GPU if cuda else DistributedType.MULTI_CPU
        if self.plugin.ignored_modules and (config.tp_enabled or config.dp_replicate_enabled):
            raise ValueError(
                "FullyShardedDataParallelPlugin.ignored_modules is not supported with tp_size "
                "or dp_replicate_size > 1 (their whole gradients would need syncing over two "
                "groups): leave ignored_modules out, or use FSDP alone (dp_shard_size only)."
            )

    def data_parallel(self) -> tuple[int, int]:
        """(How many different batches a step sees, which of them this rank reads).

        Ranks of one ``tp``/``cp`` group read the same batch; ``dp`` is Accelerate's
        flattened ``dp_replicate × dp_shard``.
        """
        if not self.config.dp_dim_names:
            return 1, 0
        dp = self.flat["dp"]
        return dp.size(), dp.get_local_rank()

    def reads_for_its_group(self) -> bool:
        """Whether this rank is the first of the ``tp``/``cp`` group that reads its batch (the
        one whose batches the speed figures count, so a batch is counted once)."""
        coordinates = self.config.layout().coordinates(self.rank)
        return all(coordinates.get(name, 0) == 0 for name in ("cp", "tp"))

    def grad_scaler(self, options: dict[str, Any]) -> Any:
        """fp16's scaler; an overflow on any rank skips every rank's step (the world group)."""
        if self.mixed_precision != "fp16":
            return None
        return _ShardedScaler(self.device.type, process_group=None, **options)

    def _shard(self, model: nn.Module) -> None:
        if self.config.tp_enabled:
            apply_tensor_parallel(model, self.device_mesh["tp"], self.config.tp_plan)
        if self.config.shards:
            super()._shard(model)
        if self.config.cp_enabled:
            _drop_attention_masks(model)

    @contextlib.contextmanager
    def context_parallel(
        self,
        buffers: Sequence[torch.Tensor] | None,
        buffer_seq_dims: Sequence[int] | None,
        no_restore_buffers: set[torch.Tensor] | None,
    ) -> Iterator[None]:
        """Shard ``buffers`` along their sequence dims over ``cp`` and run ring attention."""
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        assert self.config.cp_handler is not None  # made with cp_size > 1
        set_rotate_method(self.config.cp_handler.cp_comm_strategy)
        with context_parallel(
            self.device_mesh["cp"],
            buffers=list(buffers or []),
            buffer_seq_dims=list(buffer_seq_dims or []),
            no_restore_buffers=no_restore_buffers,
        ):
            yield


def _drop_attention_masks(model: nn.Module) -> None:
    """CP only knows full causal attention: attention layers get ``is_causal=True`` instead
    of a mask, as Accelerate does; a model that says it cannot do that is refused."""
    if not getattr(model, "supports_context_parallel", True):
        raise ValueError(
            f"{type(model).__name__} does not support context parallel (its attention needs a "
            "mask stricter than causal, or a recurrent state): set cp_size=1."
        )

    def causal(_module: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        if "attention_mask" in kwargs:
            kwargs["attention_mask"] = None
            kwargs["is_causal"] = True
        return args, kwargs

    for name, module in model.named_modules():
        if name.endswith("self_attn"):
            module.register_forward_pre_hook(causal, with_kwargs=True)
