"""Many ranks' output in one pane: the failed ranks and the straggler first, then one line per
distinct line printed, naming its ranks; a filter shows some ranks' own lines.

The rows are drawn from :class:`~notebook_kit.live.rank_groups.RankLines` as plain data
(:func:`grouped_rows`, :func:`picked_rows`), then as HTML for the pane and the saved notebook
or as text for the record and a plain-text reader. Only the newest rows are drawn, so the pane
and the saved output stay small with 512 ranks printing for hours.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from notebook_kit.live.observer import rank_label
from notebook_kit.live.rank_groups import RankLines, parse_ranks, rank_spec

__all__ = ["GroupedOutput", "Row", "grouped_rows", "picked_rows", "rows_html", "rows_text"]

Row = tuple[str, str]  # (kind: "failed", "straggler", "stderr", "note" or "", text)

LIVE_ROWS = 200  # rows in the pane while the run goes
SAVED_ROWS = 300  # rows kept in the saved notebook
_LINE_CHARS = 400  # a longer line is cut, with its length said
_FIRST_SHOWN = 8  # failed ranks shown with their lines; the others are named
_OWN_LINES = 8  # a failed rank's or the straggler's own newest lines shown
_TRACE_LINES = 15  # the end of a failed rank's traceback shown
_COLOURS = {"failed": "#b00020", "stderr": "#b00020", "straggler": "#b26a00", "note": "#666"}
_PRE_STYLE = "margin:0;font-size:12px;line-height:1.3;white-space:pre-wrap"
PANE_HEIGHT = "6.4em"  # under the filter, within the tabs' fixed height
HINT = "filter by rank: 0-7,12 · empty: every rank, grouped"


def _cut(text: str) -> str:
    if len(text) <= _LINE_CHARS:
        return text
    return f"{text[:_LINE_CHARS]}… ({len(text)} characters)"


def grouped_rows(
    lines: RankLines,
    nodes: dict[int, int],
    tracebacks: dict[int, str] | None = None,
    limit: int = LIVE_ROWS,
) -> list[Row]:
    """The failed ranks (their own newest lines and the end of their traceback) and the
    straggler first, then the newest ``limit`` distinct lines, each naming its ranks."""
    rows: list[Row] = []
    failed = list(lines.failed)
    for rank in failed[:_FIRST_SHOWN]:
        rows.append(("failed", f"{rank_label(rank, nodes)} ✗ failed:"))
        rows.extend(_own_rows(lines, rank))
        trace = (tracebacks or {}).get(rank, "").rstrip().splitlines()[-_TRACE_LINES:]
        rows.extend(("failed", f"  {_cut(line)}") for line in trace)
    if failed[_FIRST_SHOWN:]:
        rows.append(("failed", f"ranks {rank_spec(failed[_FIRST_SHOWN:])} failed too"))
    if lines.straggler is not None and lines.straggler not in failed:
        rows.append(("straggler", f"{rank_label(lines.straggler, nodes)} · the straggler:"))
        rows.extend(_own_rows(lines, lines.straggler))
    groups = lines.groups()
    earlier = len(groups) - limit + lines.dropped_groups
    if earlier > 0:
        rows.append(("note", f"… {earlier} earlier distinct lines (filter by rank to read them)"))
    rows.extend(
        ("stderr" if group.stderr else "", _cut(group.label())) for group in groups[-limit:]
    )
    return rows


def _own_rows(lines: RankLines, rank: int) -> list[Row]:
    own = lines.own(rank)[-_OWN_LINES:]
    return [("stderr" if stream == "stderr" else "", f"  {_cut(text)}") for stream, text in own]


def picked_rows(lines: RankLines, ranks: Sequence[int], limit: int = LIVE_ROWS) -> list[Row]:
    """The newest ``limit`` kept lines of ``ranks`` as they printed them, in arrival order
    (prefixed ``[rank N]`` when several ranks are picked)."""
    picked = lines.picked(ranks, limit)
    several = len(ranks) > 1
    return [
        ("stderr" if stream == "stderr" else "", _cut(f"[rank {rank}] {text}" if several else text))
        for rank, stream, text in picked
    ]


def rows_html(rows: list[Row]) -> str:
    """The rows as one ``<pre>``: failed ranks and stderr in red, the straggler in amber."""
    shown = []
    for kind, text in rows:
        escaped = html.escape(text)
        colour = _COLOURS.get(kind)
        shown.append(f'<span style="color:{colour}">{escaped}</span>' if colour else escaped)
    return f'<pre style="{_PRE_STYLE}">{chr(10).join(shown)}</pre>'


def rows_text(rows: list[Row]) -> str:
    return "\n".join(text for _, text in rows)


def heading(lines: RankLines) -> str:
    """``512 ranks · 51200 lines, 100 distinct``."""
    total = sum(lines.counts.values())
    distinct = len(lines.groups()) + lines.dropped_groups
    return f"{len(lines.ranks)} ranks · {total} lines, {distinct} distinct"


class GroupedOutput:
    """The pane of grouped lines, its rank filter (an ipywidgets Text) and the filter's note.

    The filter's handler runs where the kernel serves the widget (a subshell while the cell
    runs): it only notes the text; :meth:`draw` reads it on the main thread.

    Example::

        output = GroupedOutput(view.shared); output.draw(lines, nodes)
    """

    def __init__(self, shared: Any) -> None:
        import ipywidgets as widgets  # with the notebook view only

        self.filter = widgets.Text(
            placeholder="0-7,12",
            description="ranks",
            continuous_update=False,  # parsed on Enter, not at every key
            layout=widgets.Layout(width="14em"),
            _dom_classes=("nk-rank-filter",),
        )
        self.note = shared.html(HINT, ("nk-rank-filter-note",))
        self.pane = shared.html(_pane([]), ("nk-rank-groups",))
        row = widgets.HBox([self.filter, self.note], layout=shared.layout)
        self.box = widgets.VBox([row, self.pane], layout=shared.layout)
        self.asked = ""  # the filter's text, as the handler noted it
        self._applied: str | None = None
        self._picked: tuple[int, ...] | None = None
        self._drawn: tuple[Any, ...] | None = None
        self.filter.observe(self._noted, "value")

    def _noted(self, change: dict[str, Any]) -> None:
        self.asked = str(change["new"])

    def draw(self, lines: RankLines, nodes: dict[int, int]) -> None:
        """Apply a new filter, and redraw the pane if a line came or the filter changed."""
        asked = self.asked
        if asked != self._applied:
            self._applied = asked
            try:
                self._picked = parse_ranks(asked, lines.ranks)
            except ValueError as error:
                self._picked = None
                self.note.value = f'<span style="color:#b00020">{html.escape(str(error))}</span>'
            else:
                shown = "" if self._picked is None else f"showing {rank_spec(self._picked)} · "
                self.note.value = html.escape(shown + HINT)
        key = (lines.version, lines.failed, lines.straggler, self._picked)
        if key == self._drawn:
            return
        self._drawn = key
        if self._picked is None:
            rows = grouped_rows(lines, nodes)
        else:
            rows = picked_rows(lines, self._picked)
        self.pane.value = _pane(rows)


def _pane(rows: list[Row]) -> str:
    """The pane's HTML: its height fixed from the start, the newest rows kept in view."""
    shown = rows_html(rows or [("note", "nothing printed yet")])
    # column-reverse keeps the newest lines in view as the pane is refilled
    return (
        f'<div style="height:{PANE_HEIGHT};overflow:auto;display:flex;'
        f'flex-direction:column-reverse">{shown}</div>'
    )
