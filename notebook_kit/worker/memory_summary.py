"""What a CUDA memory snapshot says in a few lines: the largest live allocations, by source line.

A snapshot is the dict ``torch.cuda.memory._snapshot()`` returns (the pickle that
pytorch.org/memory_viz reads): ``segments``, each with its ``blocks``; a live block's
``frames`` are the Python stack that allocated it, innermost first, recorded while the
allocator's history was on. Plain data in, text out: no GPU needed, so it is tested on any
machine with a snapshot written as torch writes them.
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Allocations", "describe_snapshot", "largest_allocations", "made_by"]

LIVE = "active_allocated"  # a block a tensor holds now (not freed, not awaiting a stream)
_UNKNOWN = "allocated before the history was recorded"
# Frames inside these folders are the machinery between the user's line and the allocator.
_MACHINERY = (os.path.dirname(os.__file__) + os.sep, str(Path(__file__).parents[1]) + os.sep)


@dataclass(frozen=True)
class Allocations:
    """The live blocks one source line made: their bytes and how many."""

    where: str  # "train.py:42 in forward: h = self.big(x)", or why it is not known
    size: int
    count: int


def made_by(frames: Iterable[Mapping[str, Any]], skip: tuple[str, ...] = ()) -> str:
    """The line that asked for a block: its innermost frame outside torch, notebook_kit and
    the standard library (``skip`` adds folders), with the line's text when it can be read.

    Example:
        >>> made_by([{"filename": "/work/train.py", "line": 3, "name": "forward"}])
        '/work/train.py:3 in forward'
    """
    frames = [frame for frame in frames if frame.get("filename") not in (None, "", "??")]
    if not frames:
        return _UNKNOWN
    machinery = (*_MACHINERY, *skip, *_torch_folder())
    outside = [frame for frame in frames if not str(frame["filename"]).startswith(machinery)]
    frame = (outside or frames)[0]
    filename, line = str(frame["filename"]), int(frame.get("line", 0))
    text = linecache.getline(filename, line).strip()  # a notebook cell's too, in a forked rank
    where = f"{filename}:{line} in {frame.get('name', '?')}"
    return f"{where}: {text}" if text else where


def _torch_folder() -> tuple[str, ...]:
    import torch  # loaded wherever there is a snapshot to read

    return (os.path.dirname(torch.__file__) + os.sep,)


def largest_allocations(snapshot: Mapping[str, Any], top: int = 5) -> list[Allocations]:
    """The ``top`` source lines holding the most live memory in ``snapshot``, largest first.

    Example:
        >>> block = {"size": 1024, "state": "active_allocated",
        ...          "frames": [{"filename": "/work/a.py", "line": 1, "name": "f"}]}
        >>> largest_allocations({"segments": [{"blocks": [block, block]}]})
        [Allocations(where='/work/a.py:1 in f', size=2048, count=2)]
    """
    sizes: dict[str, list[int]] = {}
    for segment in snapshot.get("segments", ()):
        for block in segment.get("blocks", ()):
            if block.get("state") == LIVE:
                found = sizes.setdefault(made_by(block.get("frames", ())), [0, 0])
                found[0] += int(block.get("size", 0))
                found[1] += 1
    ranked = sorted(sizes.items(), key=lambda item: -item[1][0])
    return [Allocations(where, size, count) for where, (size, count) in ranked[:top]]


def describe_snapshot(snapshot: Mapping[str, Any], path: str, rank: int, top: int = 5) -> str:
    """The lines the cell shows under the failure of a rank that ran out of memory.

    Example:
        >>> print(describe_snapshot({"segments": []}, "/tmp/rank0.pickle", 0))
        Rank 0 ran out of GPU memory holding 0 B in live tensors (0 B reserved).
        Snapshot of its allocations: /tmp/rank0.pickle (open it at https://pytorch.org/memory_viz)
    """
    segments = list(snapshot.get("segments", ()))
    allocated = sum(int(segment.get("allocated_size", 0)) for segment in segments)
    reserved = sum(int(segment.get("total_size", 0)) for segment in segments)
    lines = [
        f"Rank {rank} ran out of GPU memory holding {_size(allocated)} in live tensors "
        f"({_size(reserved)} reserved)."
    ]
    largest = largest_allocations(snapshot, top)
    if largest:
        lines.append("Largest live allocations, by the line that made them:")
        for allocation in largest:
            tensors = "block" if allocation.count == 1 else "blocks"
            size = f"{_size(allocation.size):>10}"
            lines.append(f"  {size} in {allocation.count:>3} {tensors:<6}  {allocation.where}")
    lines.append(f"Snapshot of its allocations: {path} (open it at https://pytorch.org/memory_viz)")
    return "\n".join(lines)


def _size(count: int) -> str:
    """Bytes in the unit people read them in: ``_size(3 * 2**30)`` is ``'3.00 GiB'``."""
    if count < 1024:
        return f"{count} B"
    value, unit = count / 1024, "KiB"
    for larger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.2f} {unit}"
