"""Sharding arithmetic and the prepared loader's epoch/position bookkeeping (no processes)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, TensorDataset

from notebook_kit.accelerator.data_loader import (
    PreparedDataLoader,
    prepare_data_loader,
    skip_first_batches,
)
from notebook_kit.accelerator.optimizer import GradientState
from notebook_kit.accelerator.sharding import (
    EpochRandomSampler,
    IterableDatasetShard,
    ShardedBatchSampler,
)


def _shards(length, batch_size, size, drop_last=False, split=False, even=True):
    batches = BatchSampler(range(length), batch_size, drop_last)
    samplers = [ShardedBatchSampler(batches, size, rank, split, even) for rank in range(size)]
    return samplers, [list(sampler) for sampler in samplers]


_GRID = [
    (length, batch_size, size, drop_last, split)
    for length, batch_size, size, drop_last, split in itertools.product(
        [1, 3, 7, 8, 9, 16, 17], [1, 2, 4], [1, 2, 3], [False, True], [False, True]
    )
    if not (split and batch_size % size)  # split_batches needs a divisible batch size
]


@pytest.mark.parametrize(("length", "batch_size", "size", "drop_last", "split"), _GRID)
def test_even_batches_cover_the_data_and_agree_with_len(length, batch_size, size, drop_last, split):
    samplers, shards = _shards(length, batch_size, size, drop_last, split)
    seen = [index for shard in shards for batch in shard for index in batch]
    for sampler, shard in zip(samplers, shards, strict=True):
        assert len(sampler) == len(shard)
    if size > 1:
        assert len({len(shard) for shard in shards}) == 1, "every rank runs the same steps"
    if drop_last:
        assert len(seen) == len(set(seen)), "drop_last never repeats a sample"
        return
    assert set(seen) == set(range(length)), "every sample is used"
    step = batch_size if split else batch_size * size
    assert len(seen) == -(-length // step) * step if size > 1 else length


@pytest.mark.parametrize("length", [7, 9, 16, 17])
@pytest.mark.parametrize("size", [2, 3])
def test_uneven_batches_are_disjoint_and_exact(length, size):
    samplers, shards = _shards(length, 2, size, even=False)
    seen = sorted(index for shard in shards for batch in shard for index in batch)
    assert seen == list(range(length))
    for sampler, shard in zip(samplers, shards, strict=True):
        assert len(sampler) == len(shard)


def test_wrap_around_matches_accelerate_dealing():
    _, shards = _shards(9, 2, 2)
    assert shards == [[[0, 1], [4, 5], [8, 0]], [[2, 3], [6, 7], [1, 2]]]
    _, split = _shards(10, 4, 2, split=True)
    assert split == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]


def test_split_batches_rejects_indivisible_batch_size():
    with pytest.raises(ValueError, match="divisible"):
        ShardedBatchSampler(BatchSampler(range(8), 3, False), 2, 0, split_batches=True)


def test_epoch_sampler_is_a_function_of_seed_and_epoch():
    first, second = EpochRandomSampler(20, seed=5), EpochRandomSampler(20, seed=5)
    assert list(first) == list(second)
    second.set_epoch(1)
    assert sorted(second) == list(range(20)) and list(first) != list(second)


class _Stream(IterableDataset):
    def __init__(self, length):
        self.length = length

    def __iter__(self):
        return iter(range(self.length))


@pytest.mark.parametrize("length", [5, 8, 11])
def test_iterable_shards_cover_the_stream(length):
    shards = [list(IterableDatasetShard(_Stream(length), 2, 2, rank)) for rank in range(2)]
    assert len(shards[0]) == len(shards[1])
    assert set(shards[0] + shards[1]) == set(range(length))


def _prepare(
    loader: DataLoader,
    size: int = 1,
    rank: int = 0,
    state: GradientState | None = None,
    seedable: bool = False,
) -> PreparedDataLoader:
    """``prepare_data_loader`` on CPU; a fresh ``GradientState(1)`` unless ``state`` is given."""
    return prepare_data_loader(
        loader,
        num_processes=size,
        process_index=rank,
        gradient_state=GradientState(1) if state is None else state,
        device=torch.device("cpu"),
        use_seedable_sampler=seedable,
    )


def _loader(length=10, batch_size=2, shuffle=False, size=1, rank=0, seedable=False):
    data = TensorDataset(torch.arange(length))
    loader = DataLoader(data, batch_size=batch_size, shuffle=shuffle)
    return _prepare(loader, size, rank, seedable=seedable)


def _indices(batches):
    return [batch[0].tolist() for batch in batches]


@pytest.mark.parametrize("seedable", [False, True])
def test_shuffle_changes_every_epoch_and_state_resumes_mid_epoch(seedable):
    torch.manual_seed(3)
    loader = _loader(shuffle=True, seedable=seedable)
    epoch0, epoch1 = _indices(loader), _indices(loader)
    assert epoch0 != epoch1 and sorted(i for batch in epoch0 for i in batch) == list(range(10))
    assert loader.epoch == 2
    passing = iter(loader)
    head = [next(passing), next(passing)]
    state = loader.state_dict()
    rest_of_epoch2 = _indices(passing)
    epoch3 = _indices(loader)
    assert len(_indices(head) + rest_of_epoch2) == 5
    torch.manual_seed(99)  # another seed: what the checkpoint holds must win
    resumed = _loader(shuffle=True, seedable=seedable)
    resumed.load_state_dict(state)
    torch.set_rng_state(_rng_after(head, state, seedable))
    assert _indices(resumed) == rest_of_epoch2
    assert resumed.epoch == 3 and resumed.position == 0
    assert _indices(resumed) == epoch3, "the epochs after a resumed one continue unchanged"


def _rng_after(head, state, seedable):
    """The global RNG as the uninterrupted run left it when ``state`` was taken."""
    torch.manual_seed(3)
    replay = _loader(shuffle=True, seedable=seedable)
    _indices(replay), _indices(replay)
    passing = iter(replay)
    next(passing), next(passing)
    return torch.get_rng_state()


def test_breaking_on_the_last_batch_still_ends_the_epoch():
    loader = _loader()
    for _ in loader:
        pass
    for batch_number, _ in enumerate(loader, start=1):
        if batch_number == len(loader):
            break
    assert loader.epoch == 2 and loader.state_dict()["position"] == 0


def test_end_of_dataloader_and_remainder_on_the_last_batch():
    loader = _loader(length=9, size=2, rank=1)
    flags = [loader.end_of_dataloader for _ in loader]
    assert flags == [False, False, True]
    assert loader.remainder == 9 % 4


def test_skip_first_batches_is_absolute_and_one_pass():
    loader = _loader()
    skipped = skip_first_batches(loader, 3)
    assert len(skipped) == 2 and _indices(skipped) == [[6, 7], [8, 9]]
    assert len(_indices(loader)) == 5
    plain = skip_first_batches(DataLoader(list(range(6)), batch_size=2), 1)
    assert [batch.tolist() for batch in plain] == [[2, 3], [4, 5]]


def test_iterable_loader_knows_its_last_batch():
    loader = DataLoader(_Stream(11), batch_size=2)
    state = GradientState(1)
    prepared = _prepare(loader, size=2, state=state)
    flags = [(prepared.end_of_dataloader, state.end_of_dataloader) for _ in prepared]
    assert flags[-1] == (True, True) and not any(itertools.chain(*flags[:-1]))
    assert prepared.remainder == 11 % 4 and not state.end_of_dataloader


def test_preparing_twice_and_unbatched_loaders_are_refused():
    prepared = _loader()
    with pytest.raises(ValueError, match="already prepared"):
        _prepare(prepared)
    with pytest.raises(ValueError, match="batch_size"):
        _unbatched = DataLoader(TensorDataset(torch.arange(4)), batch_size=None)
        _prepare(_unbatched)
