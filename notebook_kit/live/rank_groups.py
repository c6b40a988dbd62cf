"""Many ranks' output as a few lines: ranks that print the same line share one line.

With more than :data:`GROUPED_ABOVE` ranks a notebook cannot show a pane per rank. Here every
distinct line is kept once, with the ranks that printed it (``ranks 0–511: epoch 3``), in the
order each line first arrived; the ranks that failed and the straggler come first, each with
its own lines; a filter (``0-7,12``) gives the lines of some ranks as they printed them. The
kept lines are bounded (per rank and in all), so the kernel's memory and the saved notebook
stay small however long the run prints.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

__all__ = [
    "GROUPED_ABOVE",
    "LineGroup",
    "RankLines",
    "parse_ranks",
    "rank_spec",
    "ranks_label",
]

GROUPED_ABOVE = 8  # more ranks than this: their lines are grouped, not a tab each
_KEPT_GROUPS = 2000  # distinct lines kept; older ones are counted, then let go
_KEPT_PER_RANK = 400  # each rank's own newest lines, for the filter (fewer with many ranks)
_KEPT_LINES = 51_200  # each rank's own lines, all ranks together (100 each at 512 ranks)
_SPEC_PIECES = 12  # ranges and single ranks named in a line before the rest are counted
_RANGE = re.compile(r"^\s*(\d+)\s*(?:[-–]\s*(\d+)\s*)?$")


def rank_spec(ranks: Iterable[int], pieces: int = _SPEC_PIECES) -> str:
    """Ranks written compactly: runs as ranges, the rest listed, in order.

    Past ``pieces`` ranges or single ranks the rest are counted, not named.

    Example:
        >>> rank_spec([0, 1, 2, 3, 8, 10, 11, 12])
        '0–3, 8, 10–12'
        >>> rank_spec(range(0, 40, 2), pieces=3)
        '0, 2, 4 … +17 more'
    """
    numbers = sorted(set(ranks))
    runs: list[tuple[int, int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], number)
        else:
            runs.append((number, number))
    named = [f"{low}" if low == high else f"{low}–{high}" for low, high in runs[:pieces]]
    rest = sum(high - low + 1 for low, high in runs[pieces:])
    return ", ".join(named) + (f" … +{rest} more" if rest else "")


def ranks_label(ranks: Iterable[int]) -> str:
    """``rank 3`` or ``ranks 0–3, 8``.

    Example:
        >>> ranks_label([5]), ranks_label(range(512))
        ('rank 5', 'ranks 0–511')
    """
    numbers = sorted(set(ranks))
    return f"rank {numbers[0]}" if len(numbers) == 1 else f"ranks {rank_spec(numbers)}"


def parse_ranks(text: str, ranks: Iterable[int]) -> tuple[int, ...] | None:
    """The ranks a filter such as ``0-7,12`` picks among ``ranks``; None for an empty filter.

    Raises:
        ValueError: A part that is not a rank or a range, a range that runs backwards, or a
            rank the run does not have; the message names the part and shows how to write it.

    Example:
        >>> parse_ranks("0-3, 8", range(16))
        (0, 1, 2, 3, 8)
        >>> parse_ranks(" ", range(16)) is None
        True
    """
    known = sorted(set(ranks))
    if not text.strip():
        return None
    hint = f"write ranks and ranges such as 0-7,12 (this run has ranks {rank_spec(known)})"
    picked: set[int] = set()
    for part in text.split(","):
        match = _RANGE.match(part)
        if match is None:
            raise ValueError(f"rank filter: {part.strip()!r} is not a rank or a range; {hint}")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ValueError(f"rank filter: {part.strip()!r} runs backwards; {hint}")
        wanted = set(range(low, high + 1))
        missing = sorted(wanted - set(known))
        if missing:
            raise ValueError(f"rank filter: no rank {rank_spec(missing, 3)} in this run; {hint}")
        picked |= wanted
    return tuple(sorted(picked))


@dataclass
class LineGroup:
    """One distinct line and every rank that printed it.

    Attributes:
        text: The line (what a terminal shows of it).
        ranks: The ranks that printed it.
        count: How often it was printed, all ranks together.
        stderr: Some rank printed it on stderr.
    """

    text: str
    ranks: set[int] = field(default_factory=set)
    count: int = 0
    stderr: bool = False
    _label: str | None = field(default=None, repr=False, compare=False)

    def add(self, rank: int, stream: str) -> None:
        self.ranks.add(rank)
        self.count += 1
        self.stderr = self.stderr or stream == "stderr"
        self._label = None

    def label(self) -> str:
        """``ranks 0–511: epoch 3``, with how often when some rank printed it again; kept
        until a rank prints it again (a view redraws the same lines four times a second)."""
        if self._label is None:
            again = f" ({self.count} times)" if self.count > len(self.ranks) else ""
            self._label = f"{ranks_label(self.ranks)}: {self.text}{again}"
        return self._label


class RankLines:
    """Every rank's lines, grouped by their text, and each rank's own newest lines.

    Example:
        >>> lines = RankLines(range(4))
        >>> for rank in range(4):
        ...     lines.take(rank, "stdout", "epoch 3")
        >>> [group.label() for group in lines.groups()]
        ['ranks 0–3: epoch 3']
    """

    def __init__(self, ranks: Iterable[int]) -> None:
        self.ranks = tuple(ranks)
        kept = max(min(_KEPT_PER_RANK, _KEPT_LINES // max(len(self.ranks), 1)), 20)
        # Per rank: (arrival, stream, text); the text is the group's own string, shared.
        self._own: dict[int, collections.deque[tuple[int, str, str]]] = {
            rank: collections.deque(maxlen=kept) for rank in self.ranks
        }
        self.counts = dict.fromkeys(self.ranks, 0)
        self._groups: dict[str, LineGroup] = {}
        self.dropped_groups = 0  # distinct lines let go, the oldest first
        self.failed: tuple[int, ...] = ()  # set at the end of the attempt
        self.straggler: int | None = None  # named by the speed figures
        self.version = 0  # changes with every line taken
        self._arrival = itertools.count()

    def take(self, rank: int, stream: str, text: str) -> None:
        """A line ``rank`` printed (``text`` as a terminal shows it)."""
        own = self._own.get(rank)
        if own is None:
            return
        group = self._groups.get(text)
        if group is None:
            group = self._groups[text] = LineGroup(text)
            if len(self._groups) > _KEPT_GROUPS:  # the oldest distinct line goes
                del self._groups[next(iter(self._groups))]
                self.dropped_groups += 1
        group.add(rank, stream)
        own.append((next(self._arrival), stream, group.text))
        self.counts[rank] += 1
        self.version += 1

    def groups(self) -> list[LineGroup]:
        """The distinct lines kept, in the order each first arrived."""
        return list(self._groups.values())

    def own(self, rank: int) -> list[tuple[str, str]]:
        """``(stream, text)`` of the newest lines ``rank`` printed, oldest first."""
        return [(stream, text) for _, stream, text in self._own.get(rank, ())]

    def picked(self, ranks: Iterable[int], limit: int) -> list[tuple[int, str, str]]:
        """``(rank, stream, text)`` of the newest ``limit`` kept lines of ``ranks``, in the
        order they arrived (merged from the newest back: a filter of every rank reads only
        ``limit`` lines, not all that are kept)."""
        newest = heapq.merge(*(self._tagged(rank) for rank in ranks), reverse=True)
        chosen = list(itertools.islice(newest, limit))
        return [(rank, stream, text) for _, rank, stream, text in reversed(chosen)]

    def _tagged(self, rank: int) -> Iterator[tuple[int, int, str, str]]:
        """``rank``'s kept lines, the newest first, each with its arrival."""
        for arrival, stream, text in reversed(self._own.get(rank, ())):
            yield arrival, rank, stream, text
