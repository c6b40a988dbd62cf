"""How the ranks of a launch agree on ``find_executable_batch_size``'s size: both sides' words.

A rank that runs out of memory cannot tell the others, who may already wait in a collective
for it. So it raises :class:`BatchSizeReduction` and ends; the kernel's restart policy reads
the failure (:func:`reduction_of`), stops every rank and starts them all again with the
sizes agreed so far in :data:`AGREED_SIZES_VARIABLE`, which the decorator reads when it starts.

Example::

    raise BatchSizeReduction(rank=1, size=64, next_size=32, name="train", key="__main__.train:64")
    # the kernel: reduction_of(failure) -> Reduction(1, 64, 32, "train", "__main__.train:64")
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from notebook_kit.errors import WorkerFailure

__all__ = [
    "AGREED_SIZES_VARIABLE",
    "BatchSizeReduction",
    "Reduction",
    "agreed_sizes",
    "reduction_of",
]

# Set by the kernel only while it forks a launch's workers, so a pool or a cluster's node,
# whose ranks cannot all be restarted, never has it: its absence is the refusal.
AGREED_SIZES_VARIABLE = "NOTEBOOK_KIT_AGREED_BATCH_SIZES"

_MESSAGE = re.compile(
    r"rank (?P<rank>\d+) ran out of memory at batch size (?P<size>\d+): restarting every "
    r"rank at (?P<next_size>\d+) \(find_executable_batch_size of (?P<name>\S+), "
    r"key (?P<key>\S+)\)"
)


@dataclass(frozen=True)
class Reduction:
    """One rank's out-of-memory error, as the kernel reads it from the rank's failure.

    Attributes:
        rank: The rank that ran out of memory.
        size: The batch size it ran out of memory at.
        next_size: The smaller size every rank restarts at.
        name: The decorated function's name, for the messages.
        key: The decorated function's module, qualified name and starting size: what the
            agreed sizes are kept under.
    """

    rank: int
    size: int
    next_size: int
    name: str
    key: str

    def say(self) -> str:
        """What the cell shows before every rank restarts."""
        return (
            f"rank {self.rank} ran out of memory at batch size {self.size}: restarting every "
            f"rank at {self.next_size} (find_executable_batch_size of {self.name}; this "
            f"restart does not count against max_restarts)."
        )


class BatchSizeReduction(BaseException):
    """Raised by a rank of a launch that ran out of memory: every rank restarts smaller.

    Not an ``Exception``, as ``SystemExit`` is not: it asks the rank to end, so a user's
    ``except Exception`` around the call does not swallow it, and ``post_mortem=True`` does
    not stop the restart at a pdb prompt.
    """

    def __init__(self, rank: int, size: int, next_size: int, name: str, key: str) -> None:
        self.reduction = Reduction(rank, size, next_size, name, key)
        super().__init__(
            f"rank {rank} ran out of memory at batch size {size}: restarting every rank at "
            f"{next_size} (find_executable_batch_size of {name}, key {key})"
        )


_QUALIFIED = f"{BatchSizeReduction.__module__}.{BatchSizeReduction.__qualname__}"


def reduction_of(failure: WorkerFailure) -> Reduction | None:
    """The reduction a rank's failure asks for, or None when it failed for another reason."""
    if failure.exception_type != _QUALIFIED:
        return None
    found = _MESSAGE.fullmatch(failure.message)
    if found is None:
        return None
    return Reduction(
        int(found["rank"]), int(found["size"]), int(found["next_size"]), found["name"], found["key"]
    )


def agreed_sizes() -> dict[str, int] | None:
    """The sizes the kernel agreed on for this launch's ranks, by key; None outside such a
    launch (a pool, a cluster's node, torchrun), where no restart can carry them."""
    text = os.environ.get(AGREED_SIZES_VARIABLE)
    if text is None:
        return None
    return {str(key): int(size) for key, size in json.loads(text).items()}
