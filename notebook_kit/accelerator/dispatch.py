"""``dispatch_batches=True``: only the main process reads the data; it sends each process its batch.

The batches are the ones sharding would give (same dealing, same ``even_batches`` wrap-around,
same ``split_batches`` slices), so turning dispatch on changes who reads, not what is trained
on. Use it when only the main process can reach the data, or when reading is costly and should
happen once. Batches travel pickled, point to point, so a process that has no batch in the last
round of an uneven epoch is simply not sent one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader

from notebook_kit.accelerator.sharding import IterableDatasetShard, ShardedBatchSampler

__all__ = ["Dispatched", "dispatched_batches"]

# (batch, last batch of this process's pass, real samples in the last round or -1)
Dispatched = tuple[Any, bool, int]


def _send(payload: Dispatched | None, rank: int) -> None:
    dist.send_object_list([payload], dst=rank)


def _receive() -> Dispatched | None:
    box: list[Any] = [None]
    dist.recv_object_list(box, src=0)
    return box[0]


def _receive_all() -> Iterator[Dispatched]:
    while (payload := _receive()) is not None:
        yield payload
        if payload[1]:
            return


def _deal(rounds: Iterator[tuple[list[Any], int]], size: int) -> Iterator[Dispatched]:
    """Main process: send every round's batches out, keep its own; ``rounds`` reads ahead."""
    served = [False] * size
    current = next(rounds, None)
    while current is not None:
        batches, remainder = current
        following = next(rounds, None)
        for rank in range(size - 1, -1, -1):  # own batch last: the others start sooner
            if rank >= len(batches):
                continue
            # Only the final round can lack a process's batch: then this one is its last.
            last = following is None or rank >= len(following[0])
            payload = (batches[rank], last, remainder if following is None else -1)
            served[rank] = True
            if rank == 0:
                yield payload
            else:
                _send(payload, rank)
        current = following
    for rank in range(1, size):
        if not served[rank]:  # a process without a single batch this pass
            _send(None, rank)


def _map_rounds(
    sampler: ShardedBatchSampler,
    dataset: Any,
    options: dict[str, Any],
    start: int,
    batched_indices: bool,
) -> Iterator[tuple[list[Any], int]]:
    index_rounds = list(sampler.rounds())[start:]
    flat = [indices for shards in index_rounds for indices in shards]
    if batched_indices:  # the dataset reads a list of indices at once
        reader = DataLoader(dataset, sampler=flat, batch_size=None, **options)
    else:
        reader = DataLoader(dataset, batch_sampler=flat, **options)
    loaded = iter(reader)
    for shards in index_rounds:
        yield [next(loaded) for _ in shards], -1


def _stream_rounds(
    shard: IterableDatasetShard, collate: Callable[[list[Any]], Any], start: int, size: int
) -> Iterator[tuple[list[Any], int]]:
    for number, chunk in enumerate(shard.chunks()):
        if number < start:
            continue
        pieces = [chunk[rank * shard.piece : (rank + 1) * shard.piece] for rank in range(size)]
        yield [collate(piece) for piece in pieces], shard.tail


def dispatched_batches(
    *,
    process_index: int,
    num_processes: int,
    start: int,
    sampler: ShardedBatchSampler | None = None,
    shard: IterableDatasetShard | None = None,
    dataset: Any = None,
    options: dict[str, Any] | None = None,
    batched_indices: bool = False,
) -> Iterator[Dispatched]:
    """This process's batches of one pass, read by the main process, from batch ``start`` on.

    Give ``sampler`` (map-style data, with the DataLoader's ``dataset`` and ``options``) or
    ``shard`` (an IterableDataset).

    Example::

        for batch, last, remainder in dispatched_batches(process_index=rank,
                num_processes=2, start=0, sampler=sharded, dataset=ds, options={}):
            ...
    """
    if process_index != 0:
        return _receive_all()
    if sampler is not None:
        rounds = _map_rounds(sampler, dataset, dict(options or {}), start, batched_indices)
    else:
        assert shard is not None
        collate = (options or {}).get("collate_fn") or _identity
        rounds = _stream_rounds(shard, collate, start, num_processes)
    return _deal(rounds, num_processes)


def _identity(items: list[Any]) -> Any:
    return items
