"""``prepare_data_loader``: shard a DataLoader for one process, with Accelerate's signature.

The rules (which batches each process gets, the ``even_batches`` wrap-around, ``split_batches``)
are in :mod:`notebook_kit.accelerator.sharding`, the shuffle orders in
:mod:`notebook_kit.accelerator.samplers`, ``dispatch_batches`` in
:mod:`notebook_kit.accelerator.dispatch`; the prepared loader itself is
:class:`~notebook_kit.accelerator.prepared_loader.PreparedDataLoader`.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from notebook_kit.accelerator.operations import world_size
from notebook_kit.accelerator.optimizer import GradientState
from notebook_kit.accelerator.prepared_loader import DispatchPlan, PreparedDataLoader
from notebook_kit.accelerator.samplers import shuffled_batch_sampler
from notebook_kit.accelerator.settings import check_rng_types
from notebook_kit.accelerator.sharding import IterableDatasetShard, ShardedBatchSampler

__all__ = ["PreparedDataLoader", "prepare_data_loader", "skip_first_batches"]

_LOADER_OPTIONS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def _rebuild_options(loader: DataLoader) -> dict[str, Any]:
    options = {name: getattr(loader, name) for name in _LOADER_OPTIONS if hasattr(loader, name)}
    if not options.get("num_workers"):
        options.pop("prefetch_factor", None)
        options.pop("persistent_workers", None)
    return options


def _unsupported(slice_fn_for_dispatch: Any, torch_device_mesh: Any) -> None:
    if torch_device_mesh is not None:
        raise ValueError(
            "torch_device_mesh is not supported: notebook_kit shards data over all processes "
            "(data parallelism only); leave it None."
        )
    if slice_fn_for_dispatch is not None:
        warnings.warn(
            "slice_fn_for_dispatch is ignored: with dispatch_batches each process's batch is "
            "loaded from its own indices, never sliced out of a larger batch.",
            stacklevel=3,
        )


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[str] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Any = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
    *,
    gradient_state: GradientState | None = None,
) -> PreparedDataLoader:
    """Shard ``dataloader`` for this process (Accelerate's function, same arguments).

    ``num_processes`` and ``process_index`` default to the process group's; ``device`` is used
    only with ``put_on_device=True``. ``dispatch_batches`` (None: True for an IterableDataset
    when a process group exists) makes only process 0 read the data. Every prepared loader
    resumes mid-epoch (``use_stateful_dataloader`` is accepted and needs nothing more).

    Example::

        loader = prepare_data_loader(DataLoader(dataset, batch_size=8, shuffle=True),
            device, num_processes=2, process_index=rank, put_on_device=True)
    """
    if isinstance(dataloader, PreparedDataLoader):
        raise ValueError("This DataLoader was already prepared; prepare the original once.")
    _unsupported(slice_fn_for_dispatch, torch_device_mesh)
    grouped = dist.is_available() and dist.is_initialized()
    size = world_size() if num_processes is None else num_processes
    rank = (dist.get_rank() if grouped else 0) if process_index is None else process_index
    iterable = isinstance(dataloader.dataset, IterableDataset)
    dispatch = (iterable and grouped) if dispatch_batches is None else dispatch_batches
    common = {
        "gradient_state": gradient_state or GradientState(1),
        "device": (device or torch.device("cpu")) if put_on_device else None,
        "rng_types": tuple(check_rng_types(rng_types)),
        "non_blocking": non_blocking,
    }
    options = _rebuild_options(dataloader)
    plan = DispatchPlan(rank, size, options) if dispatch and size > 1 else None
    if iterable:
        return _prepare_iterable(dataloader, size, rank, split_batches, options, plan, common)
    return _prepare_map_style(
        dataloader, size, rank, split_batches, even_batches, options, plan, common,
        use_seedable_sampler, data_seed,
    )  # fmt: skip


def _prepare_iterable(
    loader: DataLoader,
    size: int,
    rank: int,
    split_batches: bool,
    options: dict[str, Any],
    plan: DispatchPlan | None,
    common: dict[str, Any],
) -> PreparedDataLoader:
    if loader.batch_size is None:
        raise ValueError("An IterableDataset needs a DataLoader with a batch_size to shard.")
    dataset, batch_size = loader.dataset, loader.batch_size
    if size > 1:  # one process keeps its short last batch: nothing to pad
        dataset = IterableDatasetShard(
            dataset, batch_size, size, rank, loader.drop_last, split_batches
        )
        batch_size = dataset.piece
    inner = DataLoader(dataset, batch_size=batch_size, drop_last=loader.drop_last, **options)
    return PreparedDataLoader(loader, inner, dispatch=plan, **common)


def _prepare_map_style(
    loader: DataLoader,
    size: int,
    rank: int,
    split_batches: bool,
    even_batches: bool,
    options: dict[str, Any],
    plan: DispatchPlan | None,
    common: dict[str, Any],
    use_seedable_sampler: bool,
    data_seed: int | None,
) -> PreparedDataLoader:
    batched_indices = loader.batch_sampler is None and isinstance(loader.sampler, BatchSampler)
    source = loader.sampler if batched_indices else loader.batch_sampler
    if source is None:
        raise ValueError(
            "A DataLoader with batch_size=None cannot be sharded; give it a batch_size (or a "
            "BatchSampler as its sampler or batch_sampler)."
        )
    batches, shuffle = shuffled_batch_sampler(
        source, num_processes=size, use_seedable_sampler=use_seedable_sampler, data_seed=data_seed
    )
    sharded = ShardedBatchSampler(batches, size, rank, split_batches, even_batches)
    if batched_indices:  # each sampler item is a list of indices the dataset reads at once
        inner = DataLoader(loader.dataset, sampler=sharded, batch_size=None, **options)
    else:
        inner = DataLoader(loader.dataset, batch_sampler=sharded, **options)
    if plan is not None:
        plan = DispatchPlan(rank, size, options, batched_indices)
    return PreparedDataLoader(
        loader, inner, sharded=sharded, remainder=_remainder(loader, sharded, size),
        shuffle=shuffle, dispatch=plan, **common,
    )  # fmt: skip


def _remainder(loader: DataLoader, sharded: ShardedBatchSampler, size: int) -> int:
    """Real samples in the last gathered round when ``even_batches`` pads it (else -1)."""
    batch_size = sharded.batch_size
    if size == 1 or sharded.drop_last or not batch_size:
        return -1
    total = batch_size * (1 if sharded.split_batches else size)
    return len(loader.dataset) % total


class _SkippedLoader:
    """One pass of a loader that starts after its first ``skip`` batches."""

    def __init__(self, loader: Any, skip: int) -> None:
        self.loader = loader
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        if isinstance(self.loader, PreparedDataLoader):
            self.loader._resume_at = 0  # an explicit skip replaces a pending resume
            return self.loader.iterate_from(self.skip)
        return itertools.islice(iter(self.loader), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.loader) - self.skip, 0)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "skip"):
            raise AttributeError(name)
        return getattr(self.loader, name)


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """A one-pass view of ``dataloader`` that starts at batch ``num_batches`` of the epoch.

    The count is absolute within the epoch, so it does not add to a position restored by
    ``load_state``. Later passes use ``dataloader`` itself.

    Example::

        for batch in skip_first_batches(train_dl, 10):
            ...
    """
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}.")
    return _SkippedLoader(dataloader, num_batches)
