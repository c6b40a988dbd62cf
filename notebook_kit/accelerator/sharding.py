"""Which samples each process gets: the index arithmetic behind a sharded DataLoader.

Batches are dealt round-robin: in every round of ``num_processes`` batches, process ``r``
gets batch ``r`` (or, with ``split_batches``, slice ``r`` of every batch). With
``even_batches`` the last round is completed by wrapping around to the start of the epoch, so
every process runs the same number of steps and no one waits in a collective; the duplicated
samples are dropped again by ``gather_for_metrics``. Shuffling uses one seed agreed by all
processes plus the epoch number, so every process sees the same permutation and it changes
every epoch, exactly as Accelerate's seedable sampler does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, Sampler

__all__ = [
    "EpochRandomSampler",
    "IterableDatasetShard",
    "ShardedBatchSampler",
]


class EpochRandomSampler(Sampler[int]):
    """A random permutation that is a pure function of ``seed + epoch``.

    Example:
        >>> sampler = EpochRandomSampler(5, seed=0)
        >>> sorted(sampler) == list(range(5))
        True
    """

    def __init__(self, length: int, seed: int) -> None:
        self.length = length
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.length, generator=generator).tolist())

    def __len__(self) -> int:
        return self.length


class ShardedBatchSampler(Sampler[list[int]]):
    """Deals the batches of ``batch_sampler`` to the processes (pure index arithmetic).

    Example:
        >>> batches = torch.utils.data.BatchSampler(range(10), batch_size=2, drop_last=False)
        >>> list(ShardedBatchSampler(batches, num_processes=2, process_index=1))
        [[2, 3], [6, 7], [0, 1]]
    """

    def __init__(
        self,
        batch_sampler: Any,
        num_processes: int,
        process_index: int,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        # One process has nothing to even out: its short last batch stays short.
        self.even_batches = even_batches and num_processes > 1
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        self.drop_last: bool = getattr(batch_sampler, "drop_last", False)
        self.start = 0  # batches of this process to skip in the next pass (resume)
        # Batches of ``batch_sampler`` (every process's) to skip in the next pass: a resume
        # on another number of processes, which continues at the same global sample.
        self.skip = 0
        if split_batches and (self.batch_size is None or self.batch_size % num_processes):
            raise ValueError(
                f"split_batches=True needs a batch size divisible by the number of processes "
                f"({num_processes}); got batch_size={self.batch_size}."
            )

    def __len__(self) -> int:
        return self._length(len(self.batch_sampler))

    def remaining(self) -> int:
        """This process's batches in the next pass once ``skip`` batches are left out."""
        return self._length(len(self.batch_sampler) - self.skip)

    def global_batches(self, position: int) -> int:
        """Batches of ``batch_sampler`` consumed once every process has taken ``position``."""
        return position if self.split_batches else position * self.num_processes

    def _length(self, batches: int) -> int:
        if self.split_batches:
            if self.even_batches or self.drop_last or self.batch_size is None:
                return batches
            sampler_length = len(self.batch_sampler.sampler)
            tail = sampler_length % self.batch_size
            gets_tail = tail > self.process_index * (self.batch_size // self.num_processes)
            return batches - 1 + gets_tail if tail else batches
        full_rounds, extra = divmod(batches, self.num_processes)
        if extra == 0 or self.drop_last:
            return full_rounds
        if self.even_batches:
            return full_rounds + 1
        return full_rounds + (self.process_index < extra)

    def __iter__(self) -> Iterator[list[int]]:
        rank = self.process_index
        mine = (shards[rank] for shards in self.rounds() if rank < len(shards))
        return itertools.islice(mine, self.start, None)

    def rounds(self) -> Iterator[list[list[int]]]:
        """Every process's batch of each round, in rank order (the last round may be short)."""
        return self._split_rounds() if self.split_batches else self._whole_rounds()

    def _whole_rounds(self) -> Iterator[list[list[int]]]:
        size = self.num_processes
        first_batches: list[list[int]] = []
        pending: list[list[int]] = []
        for number, batch in enumerate(self.batch_sampler):
            if len(first_batches) < size:
                first_batches.append(list(batch))
            if number < self.skip:
                continue
            pending.append(list(batch))
            if len(pending) == size and (self.batch_size is None or len(batch) == self.batch_size):
                yield pending
                pending = []
        if not pending or self.drop_last:
            return
        if not self.even_batches:
            yield pending
            return
        yield self._complete_round(pending, first_batches)

    def _complete_round(
        self, pending: list[list[int]], first_batches: list[list[int]]
    ) -> list[list[int]]:
        """Fill the last round from the start of the epoch so every process gets a batch."""
        if self.batch_size is None:  # custom batch sampler: wrap whole batches
            wrapped = itertools.cycle(first_batches)
            while len(pending) < self.num_processes:
                pending.append(next(wrapped))
        else:
            source = itertools.cycle([index for batch in first_batches for index in batch])
            pending[-1] += [next(source) for _ in range(self.batch_size - len(pending[-1]))]
            while len(pending) < self.num_processes:
                pending.append([next(source) for _ in range(self.batch_size)])
        return pending

    def _split_rounds(self) -> Iterator[list[list[int]]]:
        assert self.batch_size is not None  # checked in __init__
        piece = self.batch_size // self.num_processes
        first: list[int] = []
        for number, batch in enumerate(self.batch_sampler):
            batch = list(batch)
            first = first or batch
            if number < self.skip:
                continue
            if len(batch) < self.batch_size and not self.drop_last and self.even_batches:
                source = itertools.cycle(first)
                batch += [next(source) for _ in range(self.batch_size - len(batch))]
            starts = range(0, piece * self.num_processes, piece)
            yield [batch[begin : begin + piece] for begin in starts if begin < len(batch)]


class IterableDatasetShard(IterableDataset):
    """Gives each process its slice of every ``batch_size * num_processes`` stream items.

    The last incomplete chunk is completed from the first chunk unless ``drop_last``;
    ``tail`` then holds how many real items it had (for ``gather_for_metrics``).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        num_processes: int,
        process_index: int,
        drop_last: bool = False,
        split_batches: bool = False,
    ) -> None:
        self.dataset = dataset
        self.drop_last = drop_last
        self.chunk = batch_size if split_batches else batch_size * num_processes
        self.piece = batch_size // num_processes if split_batches else batch_size
        self.begin = self.piece * process_index
        self.tail = -1

    def __iter__(self) -> Iterator[Any]:
        for chunk in self.chunks():
            yield from chunk[self.begin : self.begin + self.piece]

    def chunks(self) -> Iterator[list[Any]]:
        """The stream in chunks of ``batch_size * num_processes`` items (one per round)."""
        self.tail = -1
        first: list[Any] = []
        chunk: list[Any] = []
        for item in self.dataset:
            chunk.append(item)
            if len(chunk) == self.chunk:
                yield chunk
                first = first or chunk
                chunk = []
        if chunk and not self.drop_last:
            self.tail = len(chunk)
            source = itertools.cycle(first or list(chunk))
            chunk += [next(source) for _ in range(self.chunk - len(chunk))]
            yield chunk
        else:
            self.tail = 0
