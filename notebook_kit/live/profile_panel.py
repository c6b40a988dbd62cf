"""The Profile button: the next steps profiled on every rank, their top operators and timeline.

A click only notes itself; the next refresh asks the run for a profile of its next
:data:`PROFILE_STEPS` steps without waiting (the launch's ``ask_profile``), and a later one
shows, per rank, the top-operators table and a timeline of the profiled steps drawn here (a
PNG inline in the page: nothing is fetched from the internet). A ``notebook_kit.profile()``
call during the run lands here too (:func:`profile_taken`). The last profile stays under the
summary (the tables as plain text, the timeline in HTML) and in ``last_run().profile``.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from notebook_kit.live.ask_button import AskButtonPanel, asker

__all__ = ["PROFILE_STEPS", "ProfilePanel", "profile_taken", "timeline_png"]

PROFILE_STEPS = 5
_running: list[ProfilePanel] = []  # the panels of the runs in progress: profile() tells them


def profile_taken(results: dict[int, Any]) -> None:
    """A profile of the run in progress came back (``{rank: ProfileResult}``): its view shows it."""
    for panel in list(_running):
        panel.results = results


class ProfilePanel(AskButtonPanel):
    """A Profile button beside Stop; each rank's top operators and timeline under the plot."""

    name = "profile"
    button_text = "Profile"
    icon = "clock-o"
    tooltip = f"Profile the next {PROFILE_STEPS} steps on every rank (torch.profiler)"

    def __init__(self) -> None:
        super().__init__()
        self.results: dict[int, Any] | None = None  # the last profile, rank by rank
        self._drawn: Any = None  # the results the block shows
        self._png = ""  # their timeline, base64

    def start(self, info: Any) -> None:
        if self not in _running:
            _running.append(self)

    def finish(self, summary: Any) -> None:
        if self in _running:
            _running.remove(self)

    def build(self, view: Any) -> list[tuple[str, Any]]:
        self._drawn = None
        return super().build(view)

    def draw(self) -> None:
        super().draw()
        # A profile() call during the run lands here too, without a click.
        if self.results is not None and self.results is not self._drawn:
            self._drawn = self.results
            self._png = timeline_png(self.results)
            self.show(self._html())

    def ask(self) -> Any:
        ask = asker("profile")
        if ask is None:
            self.show("<pre>This run cannot be profiled from the view.</pre>")
            return None
        try:
            future = ask(steps=PROFILE_STEPS)
        except RuntimeError as error:
            self.show(f"<pre>{html.escape(str(error))}</pre>")
            return None
        self.show(f"<pre>Profiling the next {PROFILE_STEPS} steps on every rank…</pre>")
        return future

    def answered(self, future: Any) -> None:
        try:
            self.results = future.result()
        except Exception as error:  # a rank that could not, a timeout, the run's end
            self.show(f"<pre>{html.escape(str(error))}</pre>")

    def _text(self) -> str:
        return "\n\n".join(result.text() for result in (self.results or {}).values())

    def _html(self) -> str:
        image = f'<img src="data:image/png;base64,{self._png}"/>' if self._png else ""
        return f"{image}<pre>{html.escape(self._text())}</pre>"

    def output(self) -> dict[str, Any] | None:
        """The last profile under the summary: its tables as plain text, with the timeline."""
        if not self.results:
            return None
        if not self._png:
            self._png = timeline_png(self.results)
        return {"text/plain": f"Profile\n{self._text()}", "text/html": self._html()}

    def record(self) -> Any:
        """``{rank: ProfileResult}`` of the last profile taken during the run, None if none."""
        return self.results


def timeline_png(results: dict[int, Any]) -> str:
    """Each rank's profiled steps on one time axis (a row per rank, the operators run in a
    step as bars, the steps shaded in turn), as base64 PNG; "" if nothing was timed."""
    rows = [r for r in results.values() if r.step_spans]
    if not rows:
        return ""
    from matplotlib.figure import Figure  # no pyplot: no global figure to close

    figure = Figure(figsize=(9, 0.5 + 0.45 * len(rows)), dpi=80)
    axes = figure.add_subplot()
    names = _top_names(rows)
    colors = {name: f"C{i}" for i, name in enumerate(names)}
    for row, result in enumerate(rows):
        for index, (start, end) in enumerate(result.step_spans):
            shade = "#eee" if index % 2 else "#ddd"
            axes.broken_barh([(start, end - start)], (row - 0.45, 0.9), color=shade)
        for name, start, end in result.spans:
            color = colors.get(name, "#999")
            axes.broken_barh([(start, max(end - start, 0.001))], (row - 0.3, 0.6), color=color)
    axes.set_yticks(range(len(rows)), [f"rank {r.rank}" for r in rows])
    axes.set_xlabel("ms from the first profiled step")
    handles = [axes.bar(0, 0, color=c, label=n[:30]) for n, c in colors.items()]
    if handles:
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode()


def _top_names(rows: list[Any]) -> list[str]:
    """The operators with the most time in the steps (at most six get a colour)."""
    totals: dict[str, float] = {}
    for result in rows:
        for name, start, end in result.spans:
            totals[name] = totals.get(name, 0.0) + end - start
    return sorted(totals, key=totals.__getitem__, reverse=True)[:6]
