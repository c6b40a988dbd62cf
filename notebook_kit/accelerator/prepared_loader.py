"""A DataLoader sharded for one process, that knows its epoch and position.

``prepare_data_loader`` (:mod:`notebook_kit.accelerator.data_loader`) rebuilds the user's
DataLoader around a sharded batch sampler (or a sharded iterable), so user code needs no
DistributedSampler. The prepared loader counts the
batches it hands out: that tells the Accelerator when the last batch of an epoch is running
(gradients must sync there; ``gather_for_metrics`` must drop wrapped samples there) and lets
``save_state`` record where to resume. Map-style data needs no read-ahead for this, so the
random state seen by a training step is the same whether or not the run was resumed.
Shuffled data keeps Accelerate's order (see :mod:`notebook_kit.accelerator.samplers`).

Limits of resuming: an IterableDataset is re-read up to the saved position (its own random
draws are not replayed), and the random state inside DataLoader worker processes
(``num_workers > 0``) is not part of a checkpoint.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from notebook_kit.accelerator.checkpoint_files import CheckpointError
from notebook_kit.accelerator.delegated import Delegated
from notebook_kit.accelerator.dispatch import dispatched_batches
from notebook_kit.accelerator.operations import send_to_device
from notebook_kit.accelerator.optimizer import GradientState
from notebook_kit.accelerator.samplers import ShuffleSampler
from notebook_kit.accelerator.sharding import IterableDatasetShard, ShardedBatchSampler
from notebook_kit.runtime import progress
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.metrics import loader_counter
from notebook_kit.runtime.seeding import synchronize_rng_states

__all__ = ["DispatchPlan", "PreparedDataLoader"]


@dataclass(frozen=True)
class DispatchPlan:
    """How this process gets its batches when only the main process reads the data."""

    process_index: int
    num_processes: int
    options: dict[str, Any]
    batched_indices: bool = False  # the DataLoader's sampler yields whole batches


class PreparedDataLoader:
    """The process's shard of a DataLoader; iterate it like the original.

    Attributes:
        epoch: Passes completed (seeds the shared shuffle of the next pass).
        position: Batches handed out in the current pass.
        end_of_dataloader: True while the last batch of a pass is being used.
        remainder: Real samples in the last round of gathered batches (-1: no wrap-around).

    Example::

        train_dl = accelerator.prepare(DataLoader(dataset, batch_size=16, shuffle=True))
        for epoch in range(3):
            for inputs, targets in train_dl:
                ...
    """

    def __init__(
        self,
        original: DataLoader,
        inner: DataLoader,
        gradient_state: GradientState,
        device: torch.device | None,
        *,
        sharded: ShardedBatchSampler | None = None,
        remainder: int = -1,
        shuffle: ShuffleSampler | None = None,
        rng_types: tuple[str, ...] = ("generator",),
        non_blocking: bool = False,
        dispatch: DispatchPlan | None = None,
    ) -> None:
        self.base_dataloader = original
        self._inner = inner
        self._sharded = sharded
        self._gradient_state = gradient_state
        self._device = device
        self._shuffle = shuffle
        self._rng_types = rng_types
        self._non_blocking = non_blocking
        self._dispatch = dispatch
        self._resume_at = 0
        self._resume_skip = 0
        self._remainder = remainder
        self.remainder = remainder
        self.epoch = 0
        self.position = 0
        self.end_of_dataloader = False

    dataset = Delegated[Any]("base_dataloader")
    batch_size = Delegated["int | None"]("base_dataloader")

    @property
    def batch_sampler(self) -> Any:
        """The sharded batch sampler (``even_batches``, ``batch_sampler``: the original)."""
        return self._sharded if self._sharded is not None else self._inner.batch_sampler

    def __len__(self) -> int:
        return len(self._sharded) if self._sharded is not None else len(self._inner)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle the next pass uses."""
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: epoch, batches handed out in it, what its shuffle came from,
        and (sharded) the batches every process took together, for a resume on another count."""
        state: dict[str, Any] = {"epoch": self.epoch, "position": self.position}
        if self._shuffle is not None:
            state.update(self._shuffle.state_dict(mid_pass=self.position > 0))
        if self._sharded is not None and self._dispatch is None:
            state["processes"] = self._sharded.num_processes
            state["global_batches"] = self._sharded.global_batches(self.position)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass continue where ``state`` was taken.

        Saved by another number of processes, the pass continues at the same global batch of
        the same shuffle: the samples every process had taken are skipped, the rest are dealt
        to this run's processes, so none is repeated or left out.
        """
        self.epoch = int(state["epoch"])
        self.position = self._resume_at = int(state["position"])
        self._resume_skip = 0
        if self._shuffle is not None:
            self._shuffle.load_state_dict(state)
        saved = state.get("processes")
        if saved is None or self._sharded is None or saved == self._sharded.num_processes:
            return
        if self._dispatch is not None or "global_batches" not in state:
            raise CheckpointError(
                f"This loader's position was saved by {saved} processes and this run has "
                f"{self._sharded.num_processes}; a loader whose batches the main process "
                "dispatches resumes only on the same number: load it with "
                f"num_processes={saved}, or prepare it with dispatch_batches=False."
            )
        self.position = self._resume_at = 0
        self._resume_skip = int(state["global_batches"])

    def __iter__(self) -> Iterator[Any]:
        start, self._resume_at = self._resume_at, 0
        skip, self._resume_skip = self._resume_skip, 0
        return self.iterate_from(start, skip)

    def iterate_from(self, start: int, skip: int = 0) -> Iterator[Any]:
        """One pass of the current epoch that begins at batch ``start`` of this process, or
        after ``skip`` batches of every process (a resume on another number of processes)."""
        self._begin_pass(resuming=start > 0 or skip > 0)
        sampler = self._sharded
        if sampler is not None:  # skipping happens on indices: no skipped sample is loaded
            sampler.start = start
            sampler.skip = skip
            self.remainder = self._remainder if sampler.even_batches else -1
            if skip:
                start = len(sampler) - sampler.remaining()  # this process's share of them
        self.position = start
        self.end_of_dataloader = False
        self._gradient_state.begin(self)
        clock, ran_out = None, False
        try:
            launch = current_launch()
            batches = self._batches(start)
            if sampler is not None:  # iterables have no length to report
                progress.report_epoch_length(launch, len(self), self)
            moving = self._device is not None and self._device.type != "cpu"
            counter = loader_counter(launch, self)  # the speed line: this loader's batches
            if counter is not None:
                clock = counter.clock
                clock.asking()
            for batch in batches:
                progress.advance(launch, 1, self)  # an integer add on rank 0, nothing elsewhere
                if counter is not None:  # samples and tokens: shapes, before the copy
                    counter.count_loader_batch(batch)
                if moving:
                    batch = send_to_device(batch, self._device, self._non_blocking)
                if clock is not None:
                    clock.handed()
                yield batch
                if clock is not None:
                    clock.asking()
            ran_out = True
        finally:
            if clock is not None:
                clock.pass_ended(ran_out)
            if sampler is not None:
                sampler.start = sampler.skip = 0
            self._gradient_state.end(self)

    def _begin_pass(self, resuming: bool) -> None:
        """Agree on the pass's random sources, as Accelerate does at the start of every pass.

        A resumed pass restores them from the checkpoint instead of agreeing again.
        """
        if self._shuffle is not None:
            self._shuffle.begin_pass(self.epoch, resuming, "generator" in self._rng_types)
        if not resuming:
            synchronize_rng_states([kind for kind in self._rng_types if kind != "generator"])

    def _batches(self, start: int) -> Iterator[Any]:
        if self._dispatch is not None:
            return self._dispatched(start)
        if self._sharded is None:
            return self._read_ahead(start)
        return self._counted(
            self._start_pass(resuming=self._sharded.start > 0 or self._sharded.skip > 0)
        )

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

    def _dispatched(self, start: int) -> Iterator[Any]:
        plan = self._dispatch
        assert plan is not None
        shard = self._inner.dataset
        received = dispatched_batches(
            process_index=plan.process_index,
            num_processes=plan.num_processes,
            start=start,
            sampler=self._sharded,
            shard=shard if isinstance(shard, IterableDatasetShard) else None,
            dataset=self.dataset,
            options=plan.options,
            batched_indices=plan.batched_indices,
        )
        for batch, last, remainder in received:
            if self._sharded is None and last:
                self.remainder = remainder if remainder > 0 else -1
            self.position += 1
            self._mark(last=last)
            yield batch
        if self.position == start:  # an empty pass still ends the epoch
            self._mark(last=True)

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
