"""Worker output by rank: one tab per rank for a few ranks, one grouped pane for many.

Lines are buffered as they arrive and the widgets are refreshed on the launcher's tick, so a
chatty worker costs one widget update per tick, not one per line. Each tab keeps the newest
lines only; the full text is what the worker printed, not what is kept here. The tabs have a
fixed height from the start (the cell does not grow while lines arrive); after the run the
same lines are rendered as static HTML and text, readable without widgets. Panels the view shows
as tabs come before the ranks' tabs. With more than
:data:`~notebook_kit.live.rank_groups.GROUPED_ABOVE` ranks one tab holds them all, grouped
(:mod:`notebook_kit.live.grouped_output`): ranks that print the same line share it.
"""

from __future__ import annotations

import collections
import collections.abc
import html
import time
from typing import Any

from notebook_kit.errors import choose_root_cause
from notebook_kit.live.grouped_output import (
    SAVED_ROWS,
    GroupedOutput,
    grouped_rows,
    heading,
    rows_html,
    rows_text,
)
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, rank_label
from notebook_kit.live.panels import Panel
from notebook_kit.live.rank_groups import GROUPED_ABOVE, RankLines
from notebook_kit.runtime.messages import OutputLine, WorkerMessage

__all__ = ["RankOutputPanel", "last_segment"]

_KEPT_LINES = 400  # per rank; older lines scroll away
ERROR_COLOUR = "#b00020"
PANE_HEIGHT = "9.5em"
TABS_HEIGHT = "200px"
_OPEN_LINES = 15  # a rank's output this short is shown open after the run
_PRE_STYLE = "margin:0;font-size:12px;line-height:1.3;white-space:pre-wrap"
_NOTHING = '<span style="color:#888">nothing printed yet</span>'


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


class RankOutputPanel(Panel):
    """Each rank's output: a tab per rank in the view, after any leading tabs (the evaluation
    table), or one tab of grouped lines with a rank filter past ``GROUPED_ABOVE`` ranks; their
    lines under the summary at the end (a run without a notebook prints each line as it comes
    instead); ``last_run().panels["output"]`` keeps them as
    :class:`~notebook_kit.live.rank_groups.RankLines`.

    Example::

        panel = RankOutputPanel(); panel.build(view); panel.start(info)
        panel.take(OutputLine(1, "stderr", "warning!")); panel.draw()
    """

    name = "output"
    place = "tab"

    def __init__(self) -> None:
        self.tabs: Any = None  # the tabs, in a notebook view
        self.grouped: GroupedOutput | None = None  # the one tab of many ranks, in a view
        self.lines = RankLines(())
        self.ranks: tuple[int, ...] = ()
        self._nodes: dict[int, int] = {}
        self._tracebacks: dict[int, str] = {}
        self._straggler_read = 0.0

    def build(self, view: Any) -> list[tuple[str, Any]]:
        import ipywidgets as widgets  # with the notebook view only

        self._shared = view.shared
        self.grouped = None
        self.tabs = widgets.Tab(
            layout=widgets.Layout(height=TABS_HEIGHT),  # the tab bar and a pane, before render
            _dom_classes=("nk-rank-output",),
        )
        self._set_ranks(())
        return [(self.place, self.tabs)]

    @property
    def controls(self) -> list[Any]:  # type: ignore[override]
        return [self.grouped.filter] if self.grouped is not None else []

    def start(self, info: LaunchInfo) -> None:
        self.lines, self._tracebacks = RankLines(info.ranks), {}
        self._nodes = info.node_of()
        if self.tabs is None:
            self.ranks = info.ranks
        elif len(info.ranks) > GROUPED_ABOVE:
            self.ranks, self.grouped = info.ranks, GroupedOutput(self._shared)
            self.tabs.children = [self.grouped.box]
            self.tabs.titles = (f"output · {len(info.ranks)} ranks",)
        else:
            self._set_ranks(info.ranks, self._nodes)

    def _set_ranks(self, ranks: tuple[int, ...], nodes: dict[int, int] | None = None) -> None:
        """A tab for each of ``ranks`` (``nodes``: rank -> node, shown in the titles of a
        multi-node run), empty."""
        self.ranks = ranks
        self._nodes = nodes or {}
        self._lines = {rank: collections.deque(maxlen=_KEPT_LINES) for rank in ranks}
        self._raw = {rank: collections.deque(maxlen=_KEPT_LINES) for rank in ranks}
        self._counts = dict.fromkeys(ranks, 0)
        self._has_error = dict.fromkeys(ranks, False)
        self._failed: set[int] = set()
        self._dirty: set[int] = set()
        self._panes = {rank: self._shared.html(_as_html(())) for rank in ranks}
        self._titles = tuple(self._rank_titles())
        self.tabs.children = [self._panes[rank] for rank in ranks]
        self.tabs.titles = self._titles

    def take(self, message: WorkerMessage | OutputLine) -> None:
        if not isinstance(message, OutputLine):
            return
        shown = last_segment(message.text)
        self.lines.take(message.rank, message.stream, shown)
        if self.tabs is not None and self.grouped is None:
            self._take_in_tab(message.rank, message.stream, shown)

    def _take_in_tab(self, rank: int, stream: str, shown: str) -> None:
        if rank not in self._lines:
            return
        text = html.escape(shown)  # a kept line never changes: escape it once
        if stream == "stderr":
            text = f'<span style="color:{ERROR_COLOUR}">{text}</span>'
            self._has_error[rank] = True
        self._lines[rank].append(text)
        self._raw[rank].append(shown)
        self._counts[rank] += 1
        self._dirty.add(rank)

    def draw(self) -> None:
        """Push the lines that arrived since the last refresh to the front end."""
        if self.grouped is not None:
            self._read_straggler()
            self.grouped.draw(self.lines, self._nodes)
            return
        if self.tabs is None or not self._dirty:
            return
        for rank in sorted(self._dirty):
            self._panes[rank].value = _as_html(self._lines[rank])
        self._dirty.clear()
        self._set_titles()

    def _read_straggler(self, now: float | None = None) -> None:
        """The straggler the speed figures name, read at most once a second (a median over
        every rank's counts)."""
        now = time.monotonic() if now is None else now
        if now - self._straggler_read < 1.0:
            return
        self._straggler_read = now
        speed = next((p for p in getattr(self.run, "panels", ()) if p.name == "speed"), None)
        figures = speed.record() if speed is not None else None
        self.lines.straggler = getattr(figures, "straggler", None)

    def _rank_titles(self) -> list[str]:
        titles = []
        for rank in self.ranks:
            mark = " ✗" if rank in self._failed else " (stderr)" if self._has_error[rank] else ""
            titles.append(f"{rank_label(rank, self._nodes)}{mark}")
        return titles

    def _set_titles(self) -> None:
        leading = self.tabs.titles[: len(self.tabs.children) - len(self.ranks)]
        titles = (*leading, *self._rank_titles())
        if titles != self._titles:
            self._titles = self.tabs.titles = titles

    def finish(self, summary: LaunchSummary) -> None:
        """Name the failed ranks (the root cause first) and mark ranks that exited with an
        error."""
        failures = list(summary.failures)
        root = choose_root_cause(failures) if failures else None
        # The root cause, then the other ranks' own errors, then those caused by another's.
        order = sorted(failures, key=lambda f: (f is not root, f.is_secondary))
        self.lines.failed = tuple(
            dict.fromkeys(f.rank for f in order if f.rank in self.lines.counts)
        )
        self._tracebacks = {f.rank: f.traceback or f.summary() for f in order}
        self._straggler_read = 0.0
        self._read_straggler()
        if self.tabs is None:
            return
        self.draw()
        if self.grouped is None:
            failed = {s.rank for s in summary.ranks if s.exit_code not in (0, None)}
            self._failed = failed & set(self.ranks)
            self._set_titles()

    def details(self) -> tuple[str, str] | None:
        if self.grouped is not None:
            return self.grouped_details()
        shown = self.static_html() if self.tabs is not None else ""
        return (shown, self.text()) if shown else None

    def grouped_details(self) -> tuple[str, str] | None:
        """Every rank's output grouped, the failed ranks first, in a ``<details>`` block."""
        if not (sum(self.lines.counts.values()) or self.lines.failed):
            return None
        rows = grouped_rows(self.lines, self._nodes, self._tracebacks, SAVED_ROWS)
        title = heading(self.lines)
        colour = f' style="color:{ERROR_COLOUR}"' if self.lines.failed else ""
        shown = (
            f"<details open><summary{colour}>{html.escape(title)}</summary>"
            f"{rows_html(rows)}</details>"
        )
        return shown, f"--- {title} ---\n{rows_text(rows)}"

    def record(self) -> RankLines:
        return self.lines

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
