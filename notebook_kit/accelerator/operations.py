"""Collective operations on tensors and nested lists, tuples and dicts of tensors.

Every function works in a plain process (world size 1, no process group) and across the
processes of the default ``torch.distributed`` group, and returns the same structure it was
given. Unlike a bare ``all_gather``, :func:`gather` accepts tensors whose first dimension
differs between processes (the last batch of an uneven data set).

Debug mode (``ACCELERATE_DEBUG_MODE=1`` in the environment, or ``PartialState().debug = True``)
first compares every process's shapes and raises :class:`DistributedOperationException` on all of
them when they cannot work together, instead of hanging or failing deep inside torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
import torch.distributed as dist

from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.metrics import waiting_on_ranks

__all__ = [
    "DistributedOperationException",
    "broadcast",
    "broadcast_object",
    "broadcast_object_list",
    "debug_mode",
    "gather",
    "gather_object",
    "pad_across_processes",
    "recursively_apply",
    "reduce",
    "send_to_device",
]

Reduction = Literal["sum", "mean", "max", "min"]
REDUCTIONS: tuple[str, ...] = ("sum", "mean", "max", "min")
_REDUCE_OPS = {"max": "MAX", "min": "MIN"}

_debug_override: bool | None = None  # set through PartialState.debug; None: the environment


class DistributedOperationException(ValueError):
    """The processes called a collective with data that cannot work together (debug mode).

    Example::

        try:
            reduce({"x": torch.ones(2 + rank)})  # shapes differ across ranks
        except DistributedOperationException as error:
            print(error)
    """


def debug_mode() -> bool:
    """True when collectives check their inputs' shapes first (``ACCELERATE_DEBUG_MODE``)."""
    if _debug_override is not None:
        return _debug_override
    return os.environ.get("ACCELERATE_DEBUG_MODE", "").strip().lower() in (
        "1",
        "true",
        "yes",
        "y",
        "on",
    )


def set_debug_mode(enabled: bool | None) -> None:
    """Turn debug mode on or off for this process (None: follow the environment again)."""
    global _debug_override
    _debug_override = enabled


def world_size() -> int:
    """Number of processes in the default group (1 without a group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def recursively_apply(function: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """Apply ``function`` to every tensor in nested lists, tuples and dicts.

    Non-tensor leaves are returned unchanged; named tuples and mapping types are kept.

    Example:
        >>> recursively_apply(lambda t: t * 2, {"a": torch.ones(1), "b": [torch.zeros(2)]})
        {'a': tensor([2.]), 'b': [tensor([0., 0.])]}
    """
    if isinstance(data, torch.Tensor):
        return function(data)
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # named tuple
        return type(data)(*(recursively_apply(function, item) for item in data))
    if isinstance(data, (list, tuple)):
        return type(data)(recursively_apply(function, item) for item in data)
    if isinstance(data, Mapping):
        return type(data)({key: recursively_apply(function, value) for key, value in data.items()})
    return data


def _tensors(data: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    recursively_apply(found.append, data)
    return found


def _verify(operation: str, data: Any, same: Callable[[tuple[int, ...], tuple[int, ...]], bool]):
    """Debug mode: raise on every process unless all processes' shapes pass ``same``."""
    if world_size() == 1 or not debug_mode():
        return
    local = [tuple(t.shape) for t in _tensors(data)]
    everyone: list[Any] = [None] * world_size()
    dist.all_gather_object(everyone, local)
    agree = all(
        len(shapes) == len(local) and all(same(a, b) for a, b in zip(shapes, local, strict=False))
        for shapes in everyone
    )
    if not agree:
        listed = "\n".join(f"  - process {rank}: {shapes}" for rank, shapes in enumerate(everyone))
        raise DistributedOperationException(
            f"{operation} needs matching tensors on every process, but their shapes differ:\n"
            f"{listed}\nMake every process pass the same structure of tensors (see "
            f"pad_across_processes for tensors that differ in one dimension)."
        )


def _equal(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return a == b


def _same_rank(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b)


def send_to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor in ``data`` to ``device``.

    Example:
        >>> send_to_device({"x": torch.ones(2)}, torch.device("cpu"))
        {'x': tensor([1., 1.])}
    """
    return recursively_apply(lambda t: t.to(device, non_blocking=non_blocking), data)


def _all_shapes(tensors: list[torch.Tensor]) -> list[list[tuple[int, ...]]]:
    """Every process's shapes of ``tensors``, in one collective: ``[rank][index]``."""
    local = [tuple(t.shape) for t in tensors]
    everyone: list[Any] = [None] * world_size()
    dist.all_gather_object(everyone, local)
    for rank, shapes in enumerate(everyone):
        if len(shapes) != len(local) or any(
            len(a) != len(b) or a[1:] != b[1:] for a, b in zip(shapes, local, strict=False)
        ):
            raise DistributedOperationException(
                f"gather needs the same structure on every process and tensors that differ only "
                f"in their first dimension; rank {rank} has shapes {shapes}, "
                f"rank {dist.get_rank()} has {local}."
            )
    return everyone


def _gather_one(tensor: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    longest = max(lengths)
    padded = tensor.contiguous()
    if tensor.shape[0] < longest:
        padded = _pad_dim(padded, 0, longest, pad_index=0, pad_first=False)
    pieces = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:length] for piece, length in zip(pieces, lengths, strict=True)])


def gather(data: Any) -> Any:
    """Concatenate tensors from every process along the first dimension.

    A 0-dimensional tensor counts as one item, so the result always has a first dimension
    equal to the sum over processes (also on a single process).

    Example:
        >>> gather(torch.tensor([1, 2]))  # world size 1
        tensor([1, 2])
    """
    data = recursively_apply(lambda t: t[None] if t.ndim == 0 else t, data)
    if world_size() == 1:
        return data
    tensors = _tensors(data)
    shapes = _all_shapes(tensors)
    results = iter(
        [
            _gather_one(tensor, [shapes[rank][index][0] for rank in range(len(shapes))])
            for index, tensor in enumerate(tensors)
        ]
    )
    return recursively_apply(lambda _: next(results), data)


def gather_object(obj: list[Any], *, group: Any = None) -> list[Any]:
    """Concatenate picklable lists from every process (rank 0's items first); ``group``: a
    process group other than the default one.

    Example:
        >>> gather_object(["a", "b"])  # world size 1
        ['a', 'b']
    """
    if not isinstance(obj, list):
        raise TypeError(f"gather_object needs a list, got {type(obj).__name__}.")
    if world_size() == 1:
        return list(obj)
    everyone: list[Any] = [None] * world_size()
    with waiting_on_ranks(current_launch()):  # waiting for the others: not this rank's compute
        dist.all_gather_object(everyone, obj, group=group)
    return [item for items in everyone for item in items]


def reduce(data: Any, reduction: Reduction = "mean", scale: float = 1.0) -> Any:
    """Reduce tensors over all processes: ``"mean"``, ``"sum"``, ``"max"`` or ``"min"``.

    Every process gets the result; ``scale`` multiplies it.

    Example:
        >>> reduce(torch.tensor([2.0]), "mean")  # world size 1
        tensor([2.])
    """
    if reduction not in REDUCTIONS:
        allowed = ", ".join(repr(name) for name in REDUCTIONS)
        raise ValueError(f"reduction must be one of {allowed}, got {reduction!r}.")
    size = world_size()
    _verify("reduce", data, _equal)
    op = getattr(dist.ReduceOp, _REDUCE_OPS.get(reduction, "SUM"))

    def _reduce(tensor: torch.Tensor) -> torch.Tensor:
        result = tensor.clone()
        if size > 1:
            dist.all_reduce(result, op=op)
        if reduction == "mean":
            result = result / size
        return result * scale if scale != 1.0 else result

    return recursively_apply(_reduce, data)


def _pad_dim(
    tensor: torch.Tensor, dim: int, size: int, pad_index: float, pad_first: bool
) -> torch.Tensor:
    shape = list(tensor.shape)
    extra = size - shape[dim]
    shape[dim] = extra
    filler = torch.full(shape, pad_index, dtype=tensor.dtype, device=tensor.device)
    parts = [filler, tensor] if pad_first else [tensor, filler]
    return torch.cat(parts, dim=dim)


def pad_across_processes(
    data: Any, dim: int = 0, pad_index: float = 0, pad_first: bool = False
) -> Any:
    """Pad tensors along ``dim`` to the largest size any process has, so they can be gathered.

    Example:
        >>> pad_across_processes(torch.ones(2, 3), dim=1)  # world size 1: unchanged
        tensor([[1., 1., 1.],
                [1., 1., 1.]])
    """
    if world_size() == 1:
        return data
    _verify("pad_across_processes", data, _same_rank)
    tensors = _tensors(data)
    local = [t.shape[dim] if dim < t.ndim else -1 for t in tensors]
    everyone: list[Any] = [None] * world_size()
    dist.all_gather_object(everyone, local)
    largest = [max(sizes) for sizes in zip(*everyone, strict=True)]
    padded = iter(
        [
            t if size < 0 or t.shape[dim] == size else _pad_dim(t, dim, size, pad_index, pad_first)
            for t, size in zip(tensors, largest, strict=True)
        ]
    )
    return recursively_apply(lambda _: next(padded), data)


def broadcast(data: Any, from_process: int = 0) -> Any:
    """Copy tensors from ``from_process`` to every process (in place, also returned).

    Example:
        >>> broadcast(torch.tensor([3]))  # world size 1
        tensor([3])
    """
    if world_size() == 1:
        return data
    _verify("broadcast", data, _equal)

    def _broadcast(tensor: torch.Tensor) -> torch.Tensor:
        dist.broadcast(tensor, src=from_process)
        return tensor

    return recursively_apply(_broadcast, data)


def broadcast_object(obj: Any, from_process: int = 0, *, group: Any = None) -> Any:
    """Return ``from_process``'s picklable object on every process (of ``group``, default:
    all).

    Example:
        >>> broadcast_object({"seed": 1})  # world size 1
        {'seed': 1}
    """
    if world_size() == 1:
        return obj
    box = [obj]
    with waiting_on_ranks(current_launch()):  # waiting for the others: not this rank's compute
        dist.broadcast_object_list(box, src=from_process, group=group)
    return box[0]


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the items of ``object_list`` by ``from_process``'s, in place (also returned).

    Example:
        >>> broadcast_object_list([{"seed": 1}])  # world size 1
        [{'seed': 1}]
    """
    if world_size() > 1:
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list
