"""Worker output grouped by rank: one tab per rank, stderr in red, failed ranks marked.

Lines are buffered as they arrive and the widgets are refreshed on the launcher's tick, so a
chatty worker costs one widget update per tick, not one per line. Each tab keeps the newest
lines only; the full text is what the worker printed, not what is kept here. The tabs have a
fixed height from the start (the cell does not grow while lines arrive); after the run the
same lines are rendered as static HTML and text, readable without widgets.
"""

from __future__ import annotations

import collections
import collections.abc
import html

import ipywidgets as widgets

from notebook_kit.live.headless import last_segment
from notebook_kit.live.observer import RankSummary, Stream, rank_label
from notebook_kit.live.shared_models import SharedModels

__all__ = ["RankOutput"]

_KEPT_LINES = 400  # per rank; older lines scroll away
ERROR_COLOUR = "#b00020"
PANE_HEIGHT = "9.5em"
TABS_HEIGHT = "200px"
_OPEN_LINES = 15  # a rank's output this short is shown open after the run
_PRE_STYLE = "margin:0;font-size:12px;line-height:1.3;white-space:pre-wrap"
_NOTHING = '<span style="color:#888">nothing printed yet</span>'


class RankOutput:
    """Tabs of worker output, one per rank, after any leading tabs (the evaluation table).

    Example:
        >>> output = RankOutput((0, 1)); output.add(1, "stderr", "warning!"); output.refresh()
    """

    def __init__(
        self,
        ranks: tuple[int, ...],
        nodes: dict[int, int] | None = None,
        shared: SharedModels | None = None,
    ) -> None:
        shared = shared if shared is not None else SharedModels()
        self.ranks = ranks
        self._nodes = nodes or {}  # rank -> node, shown in the titles of a multi-node run
        self._lines = {rank: collections.deque(maxlen=_KEPT_LINES) for rank in ranks}
        self._raw = {rank: collections.deque(maxlen=_KEPT_LINES) for rank in ranks}
        self._counts = dict.fromkeys(ranks, 0)
        self._has_error = dict.fromkeys(ranks, False)
        self._failed: set[int] = set()
        self._dirty: set[int] = set()
        self._panes = {rank: shared.html(_as_html(())) for rank in ranks}
        self._leading: list[tuple[str, widgets.Widget]] = []
        self._titles = tuple(self._rank_titles())
        self.widget = widgets.Tab(
            children=[self._panes[rank] for rank in ranks],
            titles=self._titles,
            layout=widgets.Layout(height=TABS_HEIGHT),  # the tab bar and a pane, before render
            _dom_classes=("nk-rank-output",),
        )

    def add_leading_tab(self, title: str, pane: widgets.Widget) -> None:
        """Put ``pane`` before the rank tabs and select it."""
        self._leading.append((title, pane))
        self.widget.children = [p for _, p in self._leading] + [self._panes[r] for r in self.ranks]
        self._set_titles()
        self.widget.selected_index = len(self._leading) - 1

    def add(self, rank: int, stream: Stream, line: str) -> None:
        if rank not in self._lines:
            return
        shown = last_segment(line)
        text = html.escape(shown)  # a kept line never changes: escape it once
        if stream == "stderr":
            text = f'<span style="color:{ERROR_COLOUR}">{text}</span>'
            self._has_error[rank] = True
        self._lines[rank].append(text)
        self._raw[rank].append(shown)
        self._counts[rank] += 1
        self._dirty.add(rank)

    def refresh(self) -> None:
        """Push the lines that arrived since the last refresh to the front end."""
        if not self._dirty:
            return
        for rank in sorted(self._dirty):
            self._panes[rank].value = _as_html(self._lines[rank])
        self._dirty.clear()
        self._set_titles()

    def _rank_titles(self) -> list[str]:
        titles = []
        for rank in self.ranks:
            mark = " ✗" if rank in self._failed else " (stderr)" if self._has_error[rank] else ""
            titles.append(f"{rank_label(rank, self._nodes)}{mark}")
        return titles

    def _set_titles(self) -> None:
        titles = (*(title for title, _ in self._leading), *self._rank_titles())
        if titles != self._titles:
            self._titles = self.widget.titles = titles

    def finish(self, ranks: tuple[RankSummary, ...]) -> None:
        """Mark ranks that exited with an error."""
        self.refresh()
        self._failed = {s.rank for s in ranks if s.exit_code not in (0, None)} & set(self.ranks)
        self._set_titles()

    def static_html(self) -> str:
        """Each rank's output in a ``<details>`` block: open when short or failed (in red)."""
        blocks = []
        for rank in self.ranks:
            if not self._counts[rank]:
                continue
            failed, count = rank in self._failed, self._counts[rank]
            label = rank_label(rank, self._nodes)
            title = f"{label}{' ✗' if failed else ''} · {self._count_text(rank)}"
            colour = f' style="color:{ERROR_COLOUR}"' if failed else ""
            opened = " open" if failed or count <= _OPEN_LINES else ""
            blocks.append(
                f"<details{opened}><summary{colour}>{html.escape(title)}"
                f'</summary><pre style="{_PRE_STYLE}">{chr(10).join(self._lines[rank])}'
                "</pre></details>"
            )
        return "".join(blocks)

    def text(self) -> str:
        """Each rank's output under a ``--- rank N ---`` line."""
        parts = []
        for rank in self.ranks:
            if self._counts[rank]:
                failed = " ✗" if rank in self._failed else ""
                parts.append(f"--- rank {rank}{failed} · {self._count_text(rank)} ---")
                parts.extend(self._raw[rank])
        return "\n".join(parts)

    def _count_text(self, rank: int) -> str:
        count, kept = self._counts[rank], len(self._raw[rank])
        lines = f"{count} line{'s' if count != 1 else ''}"
        return lines if kept == count else f"{lines}, the last {kept} kept"


def _as_html(rows: collections.abc.Iterable[str]) -> str:
    body = "\n".join(rows) or _NOTHING
    # column-reverse keeps the newest lines in view as the pane is refilled
    return (
        f'<div style="height:{PANE_HEIGHT};overflow:auto;display:flex;'
        f'flex-direction:column-reverse"><pre style="{_PRE_STYLE}">{body}</pre></div>'
    )
