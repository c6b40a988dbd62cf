"""Accelerate's ``ParallelismConfig``: how the ranks split the data, the shards and the layers.

``Accelerator(parallelism_config=ParallelismConfig(dp_replicate_size=2, dp_shard_size=2))``
trains with HSDP; ``tp_size`` splits each layer over a tensor-parallel group; ``cp_size``
splits each sequence (GPU only). Fields, defaults and dimension names are Accelerate's, and so
are the rules, checked when the object is made (the sizes alone) and when the Accelerator
takes it (against the world size and FSDP):

- ``dp_shard_size`` alone is FSDP, ``dp_replicate_size × dp_shard_size`` is HSDP;
- ``dp_replicate_size > 1`` with ``dp_shard_size == 1`` is refused: that is DDP, which
  needs no config; with ``tp_size > 1`` it would be DDP + TP, which is refused too;
- ``dp_shard_size`` and ``cp_size`` shard with FSDP2, so FSDP must be on;
- the sizes multiply to the world size.

Sizes left as None come from the launch (``NOTEBOOK_KIT_PARALLELISM_CONFIG_<DIM>_SIZE``, set
by ``notebook_launcher(parallelism_config_tp_size=...)`` and ``--parallelism-config-*``),
else from Accelerate's ``PARALLELISM_CONFIG_<DIM>_SIZE``, else 1.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Literal

from notebook_kit.accelerator.accelerate_objects import adopt, is_accelerates
from notebook_kit.config.mesh_layout import MESH_ORDER, MeshLayout
from notebook_kit.config.schema import SETTINGS

__all__ = [
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "adopt_parallelism",
]

_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")


@dataclass
class TorchTensorParallelConfig:
    """Options of the tensor-parallel group (Accelerate's ``TorchTensorParallelConfig``).

    Attributes:
        enable_async_tp: Overlap TP's collectives with compute; not supported (refused).
    """

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            raise ValueError(
                "TorchTensorParallelConfig(enable_async_tp=True) is not supported (Accelerate "
                "ignores it as well): leave enable_async_tp=False."
            )


@dataclass
class TorchContextParallelConfig:
    """Options of the context-parallel group (Accelerate's ``TorchContextParallelConfig``).

    Attributes:
        cp_comm_strategy: How ring attention passes keys and values: ``"allgather"`` or
            ``"alltoall"``; None: ``PARALLELISM_CONFIG_CP_COMM_STRATEGY``, else allgather.
    """

    cp_comm_strategy: Literal["allgather", "alltoall"] | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            strategy = os.environ.get("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")
            self.cp_comm_strategy = strategy  # type: ignore[assignment]
        if self.cp_comm_strategy not in ("allgather", "alltoall"):
            raise ValueError(
                "TorchContextParallelConfig.cp_comm_strategy must be 'allgather' or "
                f"'alltoall', got {self.cp_comm_strategy!r}."
            )


def _from_environment(field: str) -> int:
    """A size left as None: the launch's variable, else Accelerate's, else 1."""
    dim = field.removesuffix("_size")
    names = [f"PARALLELISM_CONFIG_{dim.upper()}_SIZE"]
    setting = SETTINGS.get(f"parallelism_config_{field}")
    if setting is not None:
        names.insert(0, setting.env_var)
    for name in names:
        raw = os.environ.get(name, "").strip()
        if raw:
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(
                    f"Environment variable {name}={raw!r} is not an integer."
                ) from None
            if value < 1:
                raise ValueError(f"Environment variable {name}={raw!r} must be at least 1.")
            return value
    return 1


def _enabled(dim: str) -> property:
    """Accelerate's ``<dim>_enabled``: True when ``<dim>_size`` is above 1."""
    return property(lambda config: getattr(config, f"{dim}_size") > 1)


@dataclass
class ParallelismConfig:
    """How the ranks split the work (Accelerate's ``ParallelismConfig``, same fields).

    Attributes:
        dp_replicate_size: Replicas of the model, each trained on its own data; with
            ``dp_shard_size`` > 1 this is HSDP (replicate across nodes, shard within).
        dp_shard_size: Ranks each replica is sharded over with FSDP2.
        tp_size: Ranks each layer is split over (tensor parallel); they see the same batch.
        cp_size: Ranks each sequence is split over (context parallel; CUDA only).
        cp_backend: ``"torch"`` (FSDP2's ring attention), the only one.
        sp_size: DeepSpeed's sequence parallel size: must be 1 (no DeepSpeed here).
        sp_backend: ``"deepspeed"``, Accelerate's only one; kept for its objects.
        tp_handler: A :class:`TorchTensorParallelConfig` (made when ``tp_size`` > 1).
        cp_handler: A :class:`TorchContextParallelConfig` (made when ``cp_size`` > 1).
        sp_handler: Must stay None (no DeepSpeed).
        tp_plan: notebook_kit's addition: how to split a model that has no plan of its own,
            as for ``torch.distributed.tensor.parallel.parallelize_module``: module name (``*``
            matches any one name part) -> ``ColwiseParallel()``, ``RowwiseParallel()``...
            A transformers model uses its own ``tp_plan`` when this is None.

    Example::

        config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
        plugin = FullyShardedDataParallelPlugin()
        accelerator = Accelerator(parallelism_config=config, fsdp_plugin=plugin)
        accelerator.torch_device_mesh["dp_shard"].size()  # 2
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: Literal["torch"] | None = None
    sp_size: int | None = None
    sp_backend: Literal["deepspeed"] | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: Any = None
    tp_plan: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in _SIZES:
            value = getattr(self, name)
            if value is None:
                value = 1 if name == "sp_size" else _from_environment(name)
                setattr(self, name, value)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"ParallelismConfig.{name} must be an integer >= 1, got {value!r}."
                )
        self.cp_backend = self.cp_backend or "torch"
        self.sp_backend = self.sp_backend or "deepspeed"
        if self.cp_backend != "torch":
            raise ValueError(
                f"ParallelismConfig.cp_backend must be 'torch', got {self.cp_backend!r}."
            )
        if self.sp_size > 1 or self.sp_handler is not None:
            raise ValueError(
                f"ParallelismConfig(sp_size={self.sp_size}) is DeepSpeed's sequence parallelism, "
                "which notebook_kit does not run: use cp_size (context parallel) instead, and "
                "leave sp_size=1 and sp_handler=None."
            )
        self.tp_handler = adopt(self.tp_handler, TorchTensorParallelConfig, "tp_handler")
        self.cp_handler = adopt(self.cp_handler, TorchContextParallelConfig, "cp_handler")
        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1 and self.cp_handler is None:
            self.cp_handler = TorchContextParallelConfig()
        if self.tp_plan is not None and not isinstance(self.tp_plan, dict):
            raise TypeError(
                "ParallelismConfig.tp_plan must be a dict of module name -> parallel style "
                f"(e.g. {{'fc1': ColwiseParallel()}}), got {type(self.tp_plan).__name__}."
            )
        self._check_rules()

    def _check_rules(self) -> None:
        if self.dp_replicate_size > 1 and self.dp_shard_size == 1:
            if self.tp_size > 1 or self.cp_size > 1:
                other = "tp_size" if self.tp_size > 1 else "cp_size"
                raise ValueError(
                    f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}, "
                    f"{other}={getattr(self, other)}) composes DDP with "
                    f"{'TP' if other == 'tp_size' else 'CP'}, which is not supported: shard "
                    "the replicas too (dp_shard_size > 1, with FSDP) or set dp_replicate_size=1."
                )
            raise ValueError(
                f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}) with "
                "dp_shard_size=1 is plain data parallel: use DDP (leave parallelism_config out; "
                "tune it with DistributedDataParallelKwargs), or set dp_shard_size > 1 for HSDP."
            )

    # -- Accelerate's properties ------------------------------------------------------------

    dp_replicate_enabled = _enabled("dp_replicate")
    dp_shard_enabled = _enabled("dp_shard")
    tp_enabled = _enabled("tp")
    cp_enabled = _enabled("cp")

    @property
    def sp_enabled(self) -> bool:
        return False

    @property
    def total_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size * self.tp_size * self.cp_size

    @property
    def data_parallel_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def non_data_parallel_size(self) -> int:
        return self.tp_size * self.cp_size

    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled dimensions over which the data is split."""
        return [n for n in ("dp_replicate", "dp_shard") if getattr(self, f"{n}_enabled")]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose ranks receive the same batch."""
        return [n for n in ("tp", "cp") if getattr(self, f"{n}_enabled")]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions FSDP shards over (flattened as ``dp_shard_cp``)."""
        return [n for n in ("dp_shard", "cp") if getattr(self, f"{n}_enabled")]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions the loss is averaged over (flattened as ``dp_cp``)."""
        return [n for n in ("dp_replicate", "dp_shard", "cp") if getattr(self, f"{n}_enabled")]

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh FSDP2 gets: ``dp_replicate`` (HSDP) then the joint ``dp_shard_cp``."""
        return [*(["dp_replicate"] if self.dp_replicate_enabled else []), "dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        return self.dp_dim_names + self.non_dp_dim_names

    @property
    def shards(self) -> bool:
        """Whether FSDP2 has a dimension to shard over (``dp_shard`` or ``cp``)."""
        return self.dp_shard_enabled or self.cp_enabled

    def layout(self) -> MeshLayout:
        """The mesh's dimensions and sizes in Accelerate's order (tp innermost)."""
        return MeshLayout.of({dim: getattr(self, f"{dim}_size") for dim in MESH_ORDER})

    def sizes_text(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)}" for name in _SIZES[:4])

    def check_world(self, world_size: int, fsdp: bool) -> None:
        """Refuse the config for ``world_size`` ranks, with FSDP on or off, naming the fix.

        Raises:
            ValueError: The sizes do not multiply to ``world_size``; a sharding dimension
                without FSDP; FSDP without a dimension to shard over.
        """
        if self.total_size != world_size:
            raise ValueError(
                f"ParallelismConfig({self.sizes_text()}) multiplies to {self.total_size}, but "
                f"the world size is {world_size}: make dp_replicate_size × dp_shard_size × "
                f"tp_size × cp_size equal {world_size}."
            )
        if self.shards and not fsdp:
            what = "context parallelism (cp_size > 1)" if self.cp_enabled else "dp_shard_size > 1"
            raise ValueError(
                f"ParallelismConfig({self.sizes_text()}): {what} needs FSDP2, which this "
                "Accelerator does not use: pass fsdp_plugin=FullyShardedDataParallelPlugin() "
                "(or launch with fsdp=True / --use-fsdp)."
            )
        if fsdp and not self.shards:
            raise ValueError(
                f"FSDP is on, but ParallelismConfig({self.sizes_text()}) leaves it nothing to "
                "shard over (dp_shard_size and cp_size are 1): set dp_shard_size > 1 (lower "
                "tp_size to leave ranks for it), or drop the FSDP plugin."
            )


def adopt_parallelism(value: Any) -> ParallelismConfig | None:
    """Ours for Accelerate's ``ParallelismConfig`` (its handlers too); ours or None unchanged.

    Raises:
        TypeError: ``value`` is neither.

    Example:
        >>> from accelerate.parallelism_config import ParallelismConfig as Theirs
        >>> adopt_parallelism(Theirs(dp_shard_size=2)).dp_shard_size
        2
    """
    if value is None or isinstance(value, ParallelismConfig):
        return value
    if type(value).__name__ == "ParallelismConfig" and is_accelerates(value):
        fields = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
        return ParallelismConfig(**fields)
    raise TypeError(
        "parallelism_config must be a ParallelismConfig (notebook_kit's or Accelerate's), "
        f"got {type(value).__name__}."
    )
