"""Collectives on nested structures, in one process and across two real gloo workers."""

from __future__ import annotations

import pytest
import torch

from notebook_kit import PartialState, notebook_launcher
from notebook_kit.accelerator.operations import (
    DistributedOperationException,
    broadcast,
    broadcast_object,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    recursively_apply,
    reduce,
)


def test_single_process_collectives_keep_the_structure():
    data = {"a": torch.tensor([1.0, 2.0]), "b": [torch.tensor(3.0)]}
    gathered = gather(data)
    assert torch.equal(gathered["a"], data["a"])
    assert gathered["b"][0].shape == (1,), "a scalar becomes one item, as on N processes"
    assert torch.equal(reduce(torch.tensor([4.0]), "mean"), torch.tensor([4.0]))
    assert gather_object(["x"]) == ["x"]
    assert broadcast_object({"k": 1}) == {"k": 1}
    assert torch.equal(broadcast(torch.tensor([5])), torch.tensor([5]))
    assert pad_across_processes(torch.ones(2, 3), dim=1).shape == (2, 3)


def test_recursively_apply_keeps_named_tuples_and_other_leaves():
    from collections import namedtuple

    Pair = namedtuple("Pair", "x y")
    result = recursively_apply(lambda t: t + 1, Pair(torch.zeros(1), "label"))
    assert isinstance(result, Pair) and result.y == "label" and result.x.item() == 1


def test_reduce_rejects_unknown_reduction():
    with pytest.raises(ValueError, match="'sum', 'mean', 'max', 'min'"):
        reduce(torch.ones(1), "median")  # type: ignore[arg-type]


def _collectives():
    rank = torch.distributed.get_rank()
    uneven = torch.arange(rank + 2)  # rank 0: 2 items, rank 1: 3 items
    nested = {"ids": [uneven], "score": torch.tensor(float(rank))}
    padded = pad_across_processes(torch.ones(1, rank + 1), dim=1, pad_index=-1, pad_first=True)
    return {
        "gather": gather(nested),
        "sum": reduce({"x": torch.tensor([rank + 1.0])}, "sum"),
        "mean": reduce(torch.tensor([rank + 1.0]), "mean", scale=2.0),
        "padded": gather(padded),
        "objects": gather_object([f"r{rank}"]),
        "broadcast": broadcast(torch.tensor([rank * 10])),
        "object": broadcast_object(rank, from_process=1),
        "max": reduce(torch.tensor([rank + 1.0, -rank]), "max"),
        "min": reduce(torch.tensor([rank + 1.0, -rank]), "min"),
        "object_list": broadcast_object_list([rank, f"r{rank}"], from_process=1),
        "debug": _debug_checks(rank),
    }


def _debug_checks(rank: int) -> list[str]:
    """Mismatched shapes raise on every rank in debug mode instead of hanging in torch."""
    state, caught = PartialState(), []
    state.debug = True
    try:
        for name, call in (
            ("reduce", lambda: reduce({"t": torch.ones(1 + rank)})),
            ("broadcast", lambda: broadcast(torch.ones(2, 1 + rank))),
            ("pad_across_processes", lambda: pad_across_processes(torch.ones([1] * (rank + 1)))),
            ("gather", lambda: gather(torch.ones(1, 1 + rank))),  # checked even without debug
        ):
            try:
                call()
            except DistributedOperationException:
                caught.append(name)
    finally:
        state.debug = False
    caught.append(f"same shapes pass: {reduce(torch.ones(2), 'sum').tolist()}")
    return caught


@pytest.mark.integration
def test_two_process_collectives():
    result = notebook_launcher(_collectives, num_processes=2)
    assert result["gather"]["ids"][0].tolist() == [0, 1, 0, 1, 2]
    assert result["gather"]["score"].tolist() == [0.0, 1.0]
    assert result["sum"]["x"].item() == 3.0
    assert result["mean"].item() == 3.0
    assert result["padded"].tolist() == [[-1.0, 1.0], [1.0, 1.0]]
    assert result["objects"] == ["r0", "r1"]
    assert result["broadcast"].item() == 0 and result["object"] == 1
    assert result["max"].tolist() == [2.0, 0.0] and result["min"].tolist() == [1.0, -1.0]
    assert result["object_list"] == [1, "r1"]
    assert result["debug"] == [
        "reduce",
        "broadcast",
        "pad_across_processes",
        "gather",
        "same shapes pass: [2.0, 2.0]",
    ]
