"""Worker output grouped by rank: one tab per rank, stderr in red, failed ranks marked.

Lines are buffered as they arrive and the widgets are refreshed on the launcher's tick, so a
chatty worker costs one widget update per tick, not one per line. Each tab keeps the newest
lines only; the full text is what the worker printed, not what is kept here.
"""

from __future__ import annotations

import collections
import html

import ipywidgets as widgets

from notebook_kit.live.observer import RankSummary, Stream

__all__ = ["RankOutput", "last_segment"]

_KEPT_LINES = 400  # per rank; older lines scroll away
ERROR_COLOUR = "#b00020"


def last_segment(line: str) -> str:
    """What a terminal would show of a line redrawn with carriage returns (a tqdm bar).

    Example:
        >>> last_segment(" 10%|#   |\\r 20%|##  |")
        ' 20%|##  |'
    """
    if "\r" not in line:
        return line
    segments = [segment for segment in line.split("\r") if segment.strip()]
    return segments[-1] if segments else ""


class RankOutput:
    """Tabs of worker output, one per rank.

    Example:
        >>> output = RankOutput((0, 1)); output.add(1, "stderr", "warning!"); output.refresh()
    """

    def __init__(self, ranks: tuple[int, ...]) -> None:
        self.ranks = ranks
        self._lines = {rank: collections.deque(maxlen=_KEPT_LINES) for rank in ranks}
        self._has_error = dict.fromkeys(ranks, False)
        self._dirty: set[int] = set()
        self._panes = {rank: widgets.HTML() for rank in ranks}
        self.widget = widgets.Tab(children=[self._panes[rank] for rank in ranks])
        self.widget.add_class("nk-rank-output")
        self._titles = [f"rank {rank}" for rank in ranks]
        self.widget.titles = tuple(self._titles)
        self.widget.layout.display = "none"  # shown once a worker prints something

    def add(self, rank: int, stream: Stream, line: str) -> None:
        if rank not in self._lines:
            return
        text = html.escape(last_segment(line))  # a kept line never changes: escape it once
        if stream == "stderr":
            text = f'<span style="color:{ERROR_COLOUR}">{text}</span>'
        self._lines[rank].append(text)
        if stream == "stderr":
            self._has_error[rank] = True
        self._dirty.add(rank)

    def refresh(self) -> None:
        """Push the lines that arrived since the last refresh to the front end."""
        if not self._dirty:
            return
        self.widget.layout.display = None
        for rank in sorted(self._dirty):
            self._panes[rank].value = _as_html(self._lines[rank])
        self._dirty.clear()
        titles = [
            f"rank {rank} (stderr)" if self._has_error[rank] else f"rank {rank}"
            for rank in self.ranks
        ]
        if titles != self._titles:
            self._titles = titles
            self.widget.titles = tuple(titles)

    def finish(self, ranks: tuple[RankSummary, ...]) -> None:
        """Mark ranks that exited with an error and open the first of them."""
        self.refresh()
        failed = [summary.rank for summary in ranks if summary.exit_code not in (0, None)]
        if not failed:
            return
        titles = list(self._titles)
        for rank in failed:
            if rank in self.ranks:
                titles[self.ranks.index(rank)] = f"rank {rank} ✗"
        self.widget.titles = tuple(titles)
        if failed[0] in self.ranks:
            self.widget.layout.display = None
            self.widget.selected_index = self.ranks.index(failed[0])


def _as_html(rows: collections.deque[str]) -> str:
    body = "\n".join(rows)
    return (
        '<pre style="max-height:16em;overflow:auto;margin:0;font-size:12px;'
        f'line-height:1.3">{body}</pre>'
    )
