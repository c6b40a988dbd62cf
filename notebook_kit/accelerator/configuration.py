"""The Accelerator's configuration objects, with Accelerate's names, fields and defaults.

``Accelerator(dataloader_config=..., gradient_accumulation_plugin=..., project_config=...,
kwargs_handlers=[...])`` takes these exactly as Accelerate's does, so a script's first lines port
unchanged. Each field's meaning here is documented on its class; where a field cannot apply to a
notebook launch (the process group already exists), the Accelerator says so with a warning.
"""

from __future__ import annotations

import copy
import enum
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

__all__ = [
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "ProjectConfiguration",
]


def _check_flag(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}.{name} must be True or False, got {value!r}.")


def _check_optional_int(owner: str, name: str, value: Any, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{name} must be an integer >= {minimum} or None, got {value!r}.")


@dataclass
class ProjectConfiguration:
    """Where numbered checkpoints go and how many are kept, as in Accelerate.

    Attributes:
        project_dir: Folder holding ``checkpoints/checkpoint_<n>``: a local path, a folder
            every node mounts, or an fsspec URL (``s3://bucket/run``, ``gs://``, ``az://``).
        automatic_checkpoint_naming: Accepted for Accelerate compatibility; ``save_state()``
            without a directory always writes the next numbered checkpoint.
        total_limit: Keep only the newest this many numbered checkpoints (None: keep all).
        logging_dir: Where trackers such as ``log_with="tensorboard"`` write (default:
            ``project_dir`` when it is a local path).
        storage_options: Options of the fsspec backend of a URL ``project_dir`` (an
            ``endpoint_url``, a profile, credentials); not part of Accelerate's object. Left
            out, the backend reads the environment and its own config files.

    Example::

        config = ProjectConfiguration("runs/a", automatic_checkpoint_naming=True, total_limit=2)
        accelerator = Accelerator(project_config=config)
    """

    project_dir: str | os.PathLike[str] | None = None
    automatic_checkpoint_naming: bool = True
    total_limit: int | None = None
    logging_dir: str | os.PathLike[str] | None = None
    storage_options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        limit = self.total_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"total_limit must be a positive integer or None, got {limit!r}.")
        if limit is not None and limit < 1:
            raise ValueError(f"total_limit must be a positive integer or None, got {limit}.")


@dataclass
class DataLoaderConfiguration:
    """How ``prepare`` shards DataLoaders (Accelerate's ``DataLoaderConfiguration``).

    Attributes:
        split_batches: Split each batch across the processes (the batch size must divide by
            their number) instead of giving each process whole batches of its own.
        dispatch_batches: Only the main process reads the data; each batch is sent to the
            others. None: True for an ``IterableDataset``, False otherwise.
        even_batches: Complete the last round from the start of the data, so every process
            runs the same number of steps (``gather_for_metrics`` drops the repeats).
        use_seedable_sampler: Shuffle with a permutation that is a pure function of
            ``data_seed`` (else torch's initial seed) and the epoch, instead of the
            DataLoader's own random sampler.
        data_seed: The seed of the seedable sampler (None: ``torch.initial_seed()``).
        non_blocking: Copy batches to the GPU without waiting (pair with ``pin_memory=True``).
        use_stateful_dataloader: Accepted; every prepared loader here already has
            ``state_dict``/``load_state_dict`` and resumes mid-epoch (no torchdata needed).

    Example::

        config = DataLoaderConfiguration(even_batches=False, use_seedable_sampler=True)
        accelerator = Accelerator(dataloader_config=config)
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        for name in (
            "split_batches", "even_batches", "use_seedable_sampler", "non_blocking",
            "use_stateful_dataloader",
        ):  # fmt: skip
            _check_flag("DataLoaderConfiguration", name, getattr(self, name))
        if self.dispatch_batches is not None:
            _check_flag("DataLoaderConfiguration", "dispatch_batches", self.dispatch_batches)
        _check_optional_int("DataLoaderConfiguration", "data_seed", self.data_seed, 0)


class KwargsHandler:
    """Base of the ``kwargs_handlers`` objects: ``to_kwargs()`` lists the changed fields.

    Example:
        >>> DistributedDataParallelKwargs(find_unused_parameters=True).to_kwargs()
        {'find_unused_parameters': True}
    """

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose value differs from the class default."""
        defaults = type(self)().to_dict()
        return {key: value for key, value in self.to_dict().items() if defaults[key] != value}


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """Gradient accumulation settings (Accelerate's ``GradientAccumulationPlugin``).

    Attributes:
        num_steps: Micro-steps per optimizer step.
        adjust_scheduler: Count the skipped micro-steps in a prepared scheduler's step count, so
            a schedule written for micro-steps is not stretched by accumulation.
        sync_with_dataloader: Always sync (and step) on the last batch of a DataLoader.
        sync_each_batch: All-reduce gradients on every micro-step (less memory under DDP, more
            communication); the optimizer still steps every ``num_steps``.

    Example::

        plugin = GradientAccumulationPlugin(num_steps=4, sync_each_batch=True)
        accelerator = Accelerator(gradient_accumulation_plugin=plugin)
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        _check_optional_int("GradientAccumulationPlugin", "num_steps", self.num_steps, 1)
        for name in ("adjust_scheduler", "sync_with_dataloader", "sync_each_batch"):
            _check_flag("GradientAccumulationPlugin", name, getattr(self, name))


class DDPCommunicationHookType(str, enum.Enum):  # noqa: UP042 (str() as Accelerate's)
    """Gradient compression hooks for DistributedDataParallel (``str`` values as Accelerate)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Options for the ``DistributedDataParallel`` wrapper of prepared models.

    The first seven fields are DistributedDataParallel's own arguments; ``comm_hook`` (with
    ``comm_wrapper`` and ``comm_state_option``) registers one of torch's gradient compression
    hooks.

    Example::

        kwargs = DistributedDataParallelKwargs(find_unused_parameters=True)
        accelerator = Accelerator(kwargs_handlers=[kwargs])
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        hooks = ("comm_hook", "comm_wrapper", "comm_state_option")
        return {key: value for key, value in super().to_dict().items() if key not in hooks}


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Options of the ``torch.amp.GradScaler`` used with ``mixed_precision="fp16"``.

    Example::

        accelerator = Accelerator(mixed_precision="fp16",
            kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Process group options: ``timeout`` bounds every collective (a stuck peer's wait).

    Where the Accelerator creates the group (torchrun, srun) all three fields are used; in a
    notebook launch the group already exists, so ``timeout`` is applied to it and a different
    ``backend`` or an ``init_method`` raises a warning naming the launcher option to use.

    Example::

        from datetime import timedelta
        accelerator = Accelerator(
            kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(minutes=5))])
    """

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: timedelta | None = None

    def __post_init__(self) -> None:
        if self.timeout is None:  # torch's own defaults
            self.timeout = timedelta(seconds=600 if self.backend == "nccl" else 1800)


@dataclass
class AutocastKwargs(KwargsHandler):
    """Options of ``torch.autocast`` under mixed precision (``enabled=False`` turns it off).

    Example::

        accelerator = Accelerator(mixed_precision="bf16",
            kwargs_handlers=[AutocastKwargs(cache_enabled=True)])
    """

    enabled: bool = True
    cache_enabled: bool | None = None
