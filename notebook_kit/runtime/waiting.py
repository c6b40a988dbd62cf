"""Where a rank is waiting: the collective a stack is in, named the way its code called it.

A rank that waits for its peers is in a collective: a ``torch.distributed`` call, or the vote
of ``should_stop()`` (a MAX all-reduce that every rank must join at the same call). Both a
live stack (a stalled run) and a traceback (a rank that lost its peer) say which one, so the
kernel can tell the user "rank 0 is in the Stop vote, rank 1 in dist.barrier" instead of only
"waiting".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePath

__all__ = ["STOP_VOTE", "collective_of", "frames_in_traceback"]

STOP_VOTE = "the Stop vote of should_stop()"
_STOPPING = PurePath(__file__).with_name("stopping.py")
_C10D = ("torch", "distributed", "distributed_c10d.py")
_FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in (?P<name>\S+)', re.MULTILINE)

Frame = tuple[str, str]  # (file name, function name), outermost first in a sequence


def collective_of(frames: Sequence[Frame]) -> str | None:
    """The collective the stack is in, or None.

    Example:
        >>> collective_of([("train.py", "train"), ("/x/torch/distributed/distributed_c10d.py",
        ...                "barrier")])
        'dist.barrier'
    """
    if any(PurePath(file) == _STOPPING and name == "_vote" for file, name in frames):
        return STOP_VOTE
    for file, name in reversed(frames):
        if PurePath(file).parts[-3:] == _C10D and not name.startswith("_"):
            return f"dist.{name}"
    return None


def frames_in_traceback(text: str) -> list[Frame]:
    """The (file, function) of every frame a formatted traceback shows, outermost first."""
    return [(match["file"], match["name"]) for match in _FRAME_LINE.finditer(text)]
