"""The progress bar of the live view: a bar once a total is known, and a line of text.

Before the first step it says it is waiting; without a total it shows the steps done and the
rate, never an empty ``0/?`` bar. Bar and text are one HTML widget (one model, one message
per change), drawn like ipywidgets' own progress bar.
"""

from __future__ import annotations

import html
import time

from notebook_kit.live.progress import ProgressState, RateClock, format_duration, progress_text
from notebook_kit.live.shared_models import SharedModels

__all__ = ["ProgressBar"]

_TRACK = (
    "display:inline-block;flex:0 0 300px;height:18px;margin-right:8px;overflow:hidden;"
    "border-radius:2px;background:var(--jp-layout-color3,#eee)"
)
_BAR = "height:100%;background:var(--jp-brand-color1,#1976d2)"
_ROW = "display:flex;align-items:center;height:28px;white-space:nowrap"


class ProgressBar:
    """A bar and a line of text, fed from a ProgressState; the bar shows only with a total.

    Example::

        bar = ProgressBar(); bar.show(state)
    """

    def __init__(self, shared: SharedModels | None = None) -> None:
        shared = shared if shared is not None else SharedModels()
        self.clock = RateClock()
        self.started = time.monotonic()
        self.text = self._text(0, None)
        self.fraction: float | None = None  # of the total done; None: no total, no bar
        self.widget = shared.html(self._html(), ("nk-progress",))

    def show(self, state: ProgressState) -> None:
        count, total = state.count, state.expected
        self.clock.observe(count)
        text = self._text(count, total)
        fraction = min(count, total) / total if total else None
        if (text, fraction) != (self.text, self.fraction):
            self.text, self.fraction = text, fraction
            self.widget.value = self._html()

    def _html(self) -> str:
        bar = ""
        if self.fraction is not None:
            width = f"{round(100 * self.fraction, 1):g}%"
            bar = (
                f'<div class="nk-progress-track" style="{_TRACK}">'
                f'<div class="progress-bar" style="{_BAR};width:{width}"></div></div>'
            )
        text = f'<span class="nk-progress-text">{html.escape(self.text)}</span>'
        return f'<div style="{_ROW}">{bar}{text}</div>'

    def _text(self, count: int, total: int | None) -> str:
        if count:
            return progress_text(count, total, self.clock)
        return f"no steps counted yet · {format_duration(time.monotonic() - self.started)}"
