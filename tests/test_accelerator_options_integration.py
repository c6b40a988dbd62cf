"""Accelerator options that only show on several processes: 2 real gloo workers."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from notebook_kit import (
    Accelerator,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    InitProcessGroupKwargs,
    gather_object,
    notebook_launcher,
)

pytestmark = pytest.mark.integration


class _Branches(nn.Module):
    """One branch is never used: DDP must be told (find_unused_parameters) or it fails."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(2, 1), nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _ddp_and_group_options() -> dict:
    accelerator = Accelerator(
        kwargs_handlers=[
            DistributedDataParallelKwargs(find_unused_parameters=True),
            InitProcessGroupKwargs(backend="gloo", timeout=timedelta(seconds=77)),
        ]
    )
    model = accelerator.prepare(_Branches())
    for _ in range(2):  # the second backward fails without find_unused_parameters
        accelerator.backward(model(torch.ones(3, 2)).sum())
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    return {
        "type": accelerator.distributed_type,
        "find_unused": model.find_unused_parameters,
        "timeout": backend.options._timeout,
    }


def test_ddp_and_process_group_options_reach_torch():
    result = notebook_launcher(_ddp_and_group_options, num_processes=2)
    assert result["type"] == DistributedType.MULTI_CPU
    assert result["find_unused"] is True
    assert result["timeout"] == timedelta(seconds=77)


class _Stream(IterableDataset):
    def __iter__(self):
        yield from (torch.tensor([i]) for i in range(13))


def _batches(accelerator: Accelerator, loader: DataLoader, passes: int = 2) -> list:
    prepared = accelerator.prepare(loader)

    def values(batch):
        return (batch[0] if isinstance(batch, list) else batch).flatten().tolist()

    return [[values(batch) for batch in prepared] for _ in range(passes)]


def _dispatch_matches_sharding() -> dict:
    rank = dist.get_rank()
    data = TensorDataset(torch.arange(13))
    results = {}
    for name, config in {
        "even": {},
        "uneven": {"even_batches": False},
        "split": {"split_batches": True},
    }.items():
        seen = {}
        for dispatch in (False, True):
            torch.manual_seed(5 + rank)  # ranks seeded differently still share one shuffle
            accelerator = Accelerator(
                dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch, **config)
            )
            seen[dispatch] = _batches(accelerator, DataLoader(data, batch_size=2, shuffle=True))
        results[name] = seen
    stream = {}
    for dispatch in (False, True):
        accelerator = Accelerator(
            dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch)
        )
        stream[dispatch] = _batches(accelerator, DataLoader(_Stream(), batch_size=2), passes=1)
    results["stream"] = stream
    return {"ranks": gather_object([results])}


def test_dispatched_batches_are_the_sharded_ones_and_ranks_share_one_shuffle():
    ranks = notebook_launcher(_dispatch_matches_sharding, num_processes=2)["ranks"]
    for rank in ranks:
        for name, seen in rank.items():
            assert seen[True] == seen[False], name
    even = [ranks[r]["even"][False] for r in (0, 1)]  # [rank][pass][batch]
    for epoch in (0, 1):
        samples = [i for r in (0, 1) for batch in even[r][epoch] for i in batch]
        assert set(samples) == set(range(13))
        assert len(samples) == 16, "13 samples, the last round completed from the start"
    assert even[0][0] != even[0][1], "a new permutation every epoch"
    uneven = [ranks[r]["uneven"][False][0] for r in (0, 1)]
    assert sorted(i for r in uneven for batch in r for i in batch) == list(range(13))
    stream = [ranks[r]["stream"][True][0] for r in (0, 1)]
    assert stream[0][0] == [0, 1] and stream[1][0] == [2, 3]


def _dispatch_resumes() -> list:
    torch.manual_seed(3)
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(20)), 2, shuffle=True))
    passing = iter(loader)
    next(passing)
    state = loader.state_dict()
    rest = [batch[0].tolist() for batch in passing]
    fresh = accelerator.prepare(DataLoader(TensorDataset(torch.arange(20)), 2, shuffle=True))
    fresh.load_state_dict(state)
    return gather_object([rest == [batch[0].tolist() for batch in fresh]])


def test_dispatched_loader_resumes_mid_epoch():
    assert notebook_launcher(_dispatch_resumes, num_processes=2) == [True, True]
