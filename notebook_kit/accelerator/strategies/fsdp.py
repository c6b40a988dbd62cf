"""The FSDP2 strategy: each rank holds a shard of every parameter, gradient and optimizer state.

``torch.distributed.fsdp.fully_shard`` turns parameters into DTensors split along dim 0 over
the ranks (``Shard(0)``), in place: the prepared model is the user's object, its names and
state dict keys unchanged. What differs from DDP, all here: the optimizer must be prepared
with its model (its parameters are swapped for the sharded ones); accumulation turns gradient
sync off with ``set_requires_gradient_sync``; the gradient norm is reduced over the shards;
the full state dict is a collective gathered to rank 0; checkpoints are sharded (DCP).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor

from notebook_kit.accelerator.collective_guard import CollectiveGuard
from notebook_kit.accelerator.handlers import Handlers
from notebook_kit.accelerator.partial_state import DistributedType, PartialState
from notebook_kit.accelerator.precision import HALF_DTYPES, MixedPrecision, patch_forward
from notebook_kit.accelerator.strategies.fsdp_plugin import (
    FullyShardedDataParallelPlugin,
    as_plugin,
)
from notebook_kit.accelerator.strategies.fsdp_state import (
    FullParts,
    ShardedParts,
    full_model_state,
    load_full_model_state,
)
from notebook_kit.accelerator.strategies.fsdp_wrap import (
    CheckpointedForward,
    IgnoredGradients,
    ignored_parameters,
    remap_optimizer,
    wrap_targets,
)
from notebook_kit.accelerator.strategies.strategy import CheckpointParts
from notebook_kit.runtime.context import current_launch

__all__ = ["FullyShardedStrategy"]

# DTensor gradients meet the scaler's one-element scale tensors; torch warns on every step
# that it replicates them, which is what unscaling a shard means.
_REPLICATED_SCALE = "Found a non-scalar tensor with numel=1"


class _ShardedScaler(ShardedGradScaler):
    """``ShardedGradScaler`` that also unscales ``ignored_modules``' whole gradients, and
    without a warning per step about replicating its scale."""

    def _unscale_grads_(
        self,
        optimizer: Any,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool = True,
    ) -> dict[torch.device, torch.Tensor]:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        sharded, whole = _by_sharding([p for p in params if p.grad is not None], _grad)
        if not (sharded and whole):
            return super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        found: dict[torch.device, torch.Tensor] = {}
        for part in (sharded, whole):
            view = SimpleNamespace(param_groups=[{"params": part}])
            for device, flag in (
                super()._unscale_grads_(view, inv_scale, found_inf, allow_fp16).items()
            ):
                found[device] = torch.maximum(found[device], flag) if device in found else flag
        return found

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_REPLICATED_SCALE)
            super().unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_REPLICATED_SCALE)
            return super().step(optimizer, *args, **kwargs)


def _grad(parameter: torch.Tensor) -> Any:
    return parameter.grad


def _by_sharding(items: list[Any], tensor_of: Any = lambda item: item) -> tuple[list, list]:
    """``items`` split into (those whose tensor is a DTensor shard, those whose is whole).

    torch's foreach kernels take one kind or the other in a list, never both: gradients of
    ``ignored_modules`` stay whole beside the shards.
    """
    sharded = [item for item in items if isinstance(tensor_of(item), DTensor)]
    whole = [item for item in items if not isinstance(tensor_of(item), DTensor)]
    return sharded, whole


def _mesh(device: torch.device, world_size: int) -> DeviceMesh:
    """A 1-D mesh over all ranks on this process's device type.

    A CPU run on a machine whose group is nccl (``cpu=True`` beside GPUs) gets a gloo group
    of its own: nccl cannot move CPU tensors, and the default mesh would pick CUDA.
    """
    if device.type == "cpu" and dist.get_backend() != "gloo":
        return DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")
    return init_device_mesh(device.type, (world_size,))


class FullyShardedStrategy:
    """FSDP2 over every rank of the job; see :class:`FullyShardedDataParallelPlugin`."""

    distributed_type = DistributedType.FSDP
    can_join = False
    times_collectives = False  # its collectives run inside forward and backward, untold apart

    def __init__(
        self,
        plugin: Any,
        state: PartialState,
        mixed_precision: MixedPrecision,
        handlers: Handlers,
        guard: CollectiveGuard,
        mesh: DeviceMesh | None = None,
    ) -> None:
        self.plugin: FullyShardedDataParallelPlugin = as_plugin(plugin)
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "Accelerator(fsdp_plugin=...) shards the model over the processes of a launch, "
                "and this process is in none: start the function with "
                "notebook_launcher(train, num_processes=2) (or isolate=True to shard over one "
                "process), or under torchrun."
            )
        self.rank = state.process_index
        self.device = state.device
        self.guard = guard
        # A ParallelismConfig's FSDP dimensions (2-D for HSDP), else every rank in one.
        self.mesh = mesh if mesh is not None else _mesh(state.device, state.num_processes)
        self.mixed_precision = mixed_precision
        self.handlers = handlers
        self._owners: dict[int, nn.Module] = {}  # id(optimizer) -> the model it trains

    # -- wrapping ---------------------------------------------------------------------------

    def _precision(self) -> MixedPrecisionPolicy:
        """The plugin's policy, else parameters gathered in the Accelerator's half precision.

        Gradients are reduced in float32 either way. The root's forward also runs under
        autocast (see ``wrap``), as Accelerate does: parameters the root shards itself then
        meet its children's half-precision outputs in the dtype each op wants.
        """
        policy = self.plugin.mixed_precision_policy
        if isinstance(policy, MixedPrecisionPolicy):
            return policy
        if self.mixed_precision in HALF_DTYPES:
            return MixedPrecisionPolicy(
                param_dtype=HALF_DTYPES[self.mixed_precision], reduce_dtype=torch.float32
            )
        return MixedPrecisionPolicy()

    def grad_scaler(self, options: dict[str, Any]) -> Any:
        """fp16's loss scaler for shards: an overflow on any rank's shard skips every rank's step.

        ``ShardedGradScaler``, as Accelerate uses under FSDP, all-reduces the overflow flag
        over the mesh's group (gloo on a CPU run), so the ranks agree on the whole gradients
        of ``ignored_modules`` as well as on the shards.
        """
        if self.mixed_precision != "fp16":
            return None
        return _ShardedScaler(self.device.type, process_group=self.mesh.get_group(), **options)

    def _offload(self) -> OffloadPolicy:
        offload = self.plugin.cpu_offload
        if not offload:
            return OffloadPolicy()
        pin = self.device.type == "cuda"  # pinning needs an accelerator: not on a CPU run
        if isinstance(offload, CPUOffloadPolicy):
            return CPUOffloadPolicy(pin_memory=offload.pin_memory and pin)
        return CPUOffloadPolicy(pin_memory=pin)

    def wrap(self, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> nn.Module:
        trainable = any(parameter.requires_grad for parameter in model.parameters())
        if trainable and not optimizers:
            raise ValueError(
                "With FSDP, prepare a model together with its optimizer: "
                "model, optimizer = accelerator.prepare(model, optimizer). Sharding replaces "
                "the model's parameters, and the optimizer must be pointed at the new ones."
            )
        names = {id(parameter): name for name, parameter in model.named_parameters()}
        # Sharded already: a pool's worker keeps the model it sharded in an earlier command.
        if not isinstance(model, FSDPModule):
            on_meta = any(p.is_meta for p in model.parameters())
            loading = self.plugin.cpu_ram_efficient_loading
            full = model.state_dict() if loading and self.rank == 0 else {}
            self._shard(model)
            if loading:  # rank 0's weights reach every shard; other ranks may be on meta
                if on_meta:
                    model.to_empty(device=self.device)
                load_full_model_state(model, full, from_rank0=True)
        if self.mixed_precision != "no":
            autocast = self.handlers.autocast_options()
            patch_forward(model, self.mixed_precision, self.device, **autocast)
        launch = current_launch()
        if launch is not None:  # the kernel gets the full weights, gathered by every rank
            launch.register_weights_gatherer(model, full_model_state)
        for optimizer in optimizers:
            if remap_optimizer(optimizer, names, model):
                self._owners[id(optimizer)] = model
        return model

    def _shard(self, model: nn.Module) -> None:
        ignored = ignored_parameters(model, self.plugin.ignored_modules)
        options = {
            "mesh": self.mesh,
            "reshard_after_forward": self.plugin.reshard_after_forward,
            "mp_policy": self._precision(),
            "offload_policy": self._offload(),
            "ignored_params": ignored or None,
        }
        targets = wrap_targets(model, self.plugin)
        for module in targets:
            if self.plugin.activation_checkpointing:
                module.forward = CheckpointedForward(module.forward)
            fully_shard(module, **options)
        fully_shard(model, **options)
        if ignored:
            gradients = IgnoredGradients(ignored, self.mesh.get_group(), self.mesh.size())
            model.__dict__[IgnoredGradients.attribute] = gradients

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model  # fully_shard works in place: the user's object, the same names

    # -- gradients --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _gradient_sync(self, model: nn.Module, requires: bool) -> Iterator[None]:
        if not isinstance(model, FSDPModule):
            yield
            return
        ignored = IgnoredGradients.of(model)
        model.set_requires_gradient_sync(requires)
        if ignored is not None:
            ignored.sync = requires
        try:
            yield
        finally:
            model.set_requires_gradient_sync(not requires)
            if ignored is not None:
                ignored.sync = not requires

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return self._gradient_sync(model, False)

    def trigger_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return self._gradient_sync(model, True)

    def clip_grad_norm(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> float:
        """Clip by the norm over every rank's shards; returns it as a plain float."""
        parameters = list(parameters)
        sharded, whole = _by_sharding([p.grad for p in parameters if p.grad is not None])
        if not (sharded and whole):
            norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
            return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        # ignored_modules: whole gradients (the same on every rank) beside sharded ones, which
        # torch's foreach kernels do not mix; the norm of the two groups' norms is the total.
        parts = torch.nn.utils.get_total_norm(sharded, norm_type).full_tensor()
        norms = torch.stack([parts, torch.nn.utils.get_total_norm(whole, norm_type)])
        norm = float(torch.nn.utils.get_total_norm([norms], norm_type))
        coefficient = min(max_norm / (norm + 1e-6), 1.0)
        torch._foreach_mul_(sharded, coefficient)
        torch._foreach_mul_(whole, coefficient)
        return norm

    # -- state ------------------------------------------------------------------------------

    def full_state_dict(self, model: nn.Module, call: str) -> dict[str, Any]:
        """Gathered to rank 0 on the CPU ({} on the others); every rank must call it."""
        self.guard.enter(call)
        return full_model_state(model)

    def checkpoint_parts(
        self, models: Sequence[nn.Module], optimizers: Sequence[Any]
    ) -> CheckpointParts:
        pairs = []
        for optimizer in optimizers:
            owner = self._owners.get(id(getattr(optimizer, "optimizer", optimizer)))
            if owner is None:
                raise ValueError(
                    "save_state with FSDP needs each optimizer prepared together with its "
                    "model: accelerator.prepare(model, optimizer)."
                )
            pairs.append((owner, optimizer))
        if self.plugin.state_dict_type == "FULL_STATE_DICT":
            return CheckpointParts(sharded=FullParts(models, pairs, self.rank))
        return CheckpointParts(sharded=ShardedParts(models, pairs))

    def enter_collective(self, call: str) -> None:
        self.guard.enter(call)
