"""A DataLoader sharded for one process, that knows its epoch and position.

``prepare_data_loader`` rebuilds the user's DataLoader around a sharded batch sampler (or a
sharded iterable), so user code needs no DistributedSampler. The prepared loader counts the
batches it hands out: that tells the Accelerator when the last batch of an epoch is running
(gradients must sync there; ``gather_for_metrics`` must drop wrapped samples there) and lets
``save_state`` record where to resume. Map-style data needs no read-ahead for this, so the
random state seen by a training step is the same whether or not the run was resumed.

Limits of resuming: an IterableDataset is re-read up to the saved position (its own random
draws are not replayed), and the random state inside DataLoader worker processes
(``num_workers > 0``) is not part of a checkpoint.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from notebook_kit.accelerator.operations import broadcast_object, send_to_device
from notebook_kit.accelerator.optimizer import GradientState
from notebook_kit.accelerator.sharding import (
    EpochRandomSampler,
    IterableDatasetShard,
    ShardedBatchSampler,
)
from notebook_kit.runtime import progress
from notebook_kit.runtime.context import current_launch

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


class PreparedDataLoader:
    """The process's shard of a DataLoader; iterate it like the original.

    Attributes:
        epoch: Passes completed (seeds the shared shuffle of the next pass).
        position: Batches handed out in the current pass.
        end_of_dataloader: True while the last batch of a pass is being used.
        remainder: Real samples in the last round of gathered batches (-1: no wrap-around).

    Example:
        >>> train_dl = accelerator.prepare(DataLoader(dataset, batch_size=16, shuffle=True))
        >>> for epoch in range(3):
        ...     for inputs, targets in train_dl:
        ...         ...
    """

    def __init__(
        self,
        original: DataLoader,
        inner: DataLoader,
        gradient_state: GradientState,
        device: torch.device,
        remainder: int = -1,
        epoch_sampler: EpochRandomSampler | None = None,
    ) -> None:
        self.base_dataloader = original
        self._inner = inner
        self._gradient_state = gradient_state
        self._device = device
        self._epoch_sampler = epoch_sampler
        self._resume_at = 0
        self.remainder = remainder
        self.epoch = 0
        self.position = 0
        self.end_of_dataloader = False

    @property
    def dataset(self) -> Any:
        return self.base_dataloader.dataset

    @property
    def batch_size(self) -> int | None:
        return self.base_dataloader.batch_size

    @property
    def batch_sampler(self) -> Any:
        return self._inner.batch_sampler

    def __len__(self) -> int:
        return len(self._inner)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle the next pass uses."""
        self.epoch = epoch

    def state_dict(self) -> dict[str, int]:
        """Where this loader stands: epoch and batches already handed out in it."""
        seed = self._epoch_sampler.seed if self._epoch_sampler is not None else -1
        return {"epoch": self.epoch, "position": self.position, "seed": seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Make the next pass continue where ``state`` was taken."""
        self.epoch = int(state["epoch"])
        self.position = self._resume_at = int(state["position"])
        if self._epoch_sampler is not None and state.get("seed", -1) != -1:
            self._epoch_sampler.seed = int(state["seed"])

    def __iter__(self) -> Iterator[Any]:
        start, self._resume_at = self._resume_at, 0
        return self.iterate_from(start)

    def iterate_from(self, start: int) -> Iterator[Any]:
        """One pass of the current epoch that begins at batch ``start`` of this process."""
        if self._epoch_sampler is not None:
            self._epoch_sampler.set_epoch(self.epoch)
        sampler = self._inner.batch_sampler
        sharded = isinstance(sampler, ShardedBatchSampler)
        if sharded:  # skipping happens on indices: no sample of a skipped batch is loaded
            sampler.start = start
        self.position = start
        self.end_of_dataloader = False
        self._gradient_state.begin(self)
        try:
            launch = current_launch()
            if isinstance(self._inner.dataset, IterableDataset):  # no length to report
                batches = self._read_ahead(start)
            else:
                batches = self._counted(self._start_pass(resuming=start > 0))
                progress.report_epoch_length(launch, len(self), self)
            on_cpu = self._device.type == "cpu"
            for batch in batches:
                progress.advance(launch, 1, self)  # an integer add on rank 0, nothing elsewhere
                yield batch if on_cpu else send_to_device(batch, self._device)
        finally:
            if sharded:
                sampler.start = 0
            self._gradient_state.end(self)

    def _start_pass(self, resuming: bool) -> Iterator[Any]:
        """``iter()`` of the inner loader, which draws a worker seed from torch's global RNG.

        The uninterrupted run drew it at the start of the epoch, before the checkpoint's RNG
        state was captured; a resumed pass must not draw it a second time.
        """
        if not resuming:
            return iter(self._inner)
        state = torch.get_rng_state()
        batches = iter(self._inner)
        torch.set_rng_state(state)
        return batches

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        total = len(self)
        for batch in batches:
            self.position += 1
            self._mark(last=self.position >= total)
            yield batch

    def _read_ahead(self, start: int) -> Iterator[Any]:
        """Iterables have no length: hold one batch back to know which one is last."""
        batches = iter(self._inner)
        for _ in itertools.islice(batches, start):
            self.position += 1
        current = next(batches, _END)
        while current is not _END:
            following = next(batches, _END)
            if following is _END:
                shard = self._inner.dataset
                tail = shard.tail if isinstance(shard, IterableDatasetShard) else -1
                self.remainder = tail if tail > 0 else -1
            self.position += 1
            self._mark(last=following is _END)
            yield current
            current = following
        if self.position == start:  # an empty pass still ends the epoch
            self._mark(last=True)

    def _mark(self, last: bool) -> None:
        self.end_of_dataloader = last
        if last:  # the pass is complete even if the loop breaks on this batch
            self.epoch += 1
            self.position = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)


_END = object()


def _rebuild_options(loader: DataLoader) -> dict[str, Any]:
    options = {name: getattr(loader, name) for name in _LOADER_OPTIONS if hasattr(loader, name)}
    if not options.get("num_workers"):
        options.pop("prefetch_factor", None)
        options.pop("persistent_workers", None)
    return options


def prepare_data_loader(
    loader: DataLoader,
    *,
    num_processes: int,
    process_index: int,
    gradient_state: GradientState,
    device: torch.device,
    split_batches: bool = False,
    even_batches: bool = True,
) -> PreparedDataLoader:
    """Shard ``loader`` for this process (see the module docstring for the rules).

    Example:
        >>> prepared = prepare_data_loader(loader, num_processes=2, process_index=0,
        ...     gradient_state=GradientState(1), device=torch.device("cpu"))
    """
    if isinstance(loader, PreparedDataLoader):
        raise ValueError("This DataLoader was already prepared; prepare the original once.")
    dataset, options = loader.dataset, _rebuild_options(loader)
    if isinstance(dataset, IterableDataset):
        if loader.batch_size is None:
            raise ValueError("An IterableDataset needs a DataLoader with a batch_size to shard.")
        batch_size = loader.batch_size
        if num_processes > 1:  # one process keeps its short last batch: nothing to pad
            dataset = IterableDatasetShard(
                dataset, batch_size, num_processes, process_index, loader.drop_last, split_batches
            )
            batch_size = dataset.piece
        inner = DataLoader(dataset, batch_size=batch_size, drop_last=loader.drop_last, **options)
        return PreparedDataLoader(loader, inner, gradient_state, device)
    batch_sampler, epoch_sampler = _seeded_batch_sampler(loader)
    batch_sampler = ShardedBatchSampler(
        batch_sampler, num_processes, process_index, split_batches, even_batches
    )
    inner = DataLoader(dataset, batch_sampler=batch_sampler, **options)
    remainder = -1
    if num_processes > 1 and even_batches and not loader.drop_last and loader.batch_size:
        total = loader.batch_size * (1 if split_batches else num_processes)
        remainder = len(dataset) % total
    return PreparedDataLoader(loader, inner, gradient_state, device, remainder, epoch_sampler)


def _seeded_batch_sampler(loader: DataLoader) -> tuple[Any, EpochRandomSampler | None]:
    """Replace ``shuffle=True`` by a permutation all processes agree on, new every epoch."""
    batch_sampler, sampler = loader.batch_sampler, loader.sampler
    if batch_sampler is None:
        raise ValueError(
            "A DataLoader with batch_size=None cannot be sharded; give it a batch_size."
        )
    shuffled = (
        type(batch_sampler) is BatchSampler
        and type(sampler) is RandomSampler
        and not sampler.replacement
        and sampler.num_samples == len(sampler.data_source)
    )
    if not shuffled:
        return batch_sampler, None
    generator = sampler.generator
    seed = generator.initial_seed() if generator is not None else torch.initial_seed()
    # Rank 0's seed wins, so ranks seeded differently still deal from one permutation.
    epoch_sampler = EpochRandomSampler(len(sampler.data_source), int(broadcast_object(seed)))
    rebuilt = BatchSampler(epoch_sampler, batch_sampler.batch_size, batch_sampler.drop_last)
    return rebuilt, epoch_sampler


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

    Example:
        >>> for batch in skip_first_batches(train_dl, 10):
        ...     ...
    """
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}.")
    return _SkippedLoader(dataloader, num_batches)
