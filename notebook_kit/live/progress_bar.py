"""The progress bar of the live view: a bar once a total is known, and a line of text.

Before the first step it says it is waiting; without a total it shows the steps done and the
rate, never an empty ``0/?`` bar.
"""

from __future__ import annotations

import html
import time

import ipywidgets as widgets

from notebook_kit.live.progress import ProgressState, RateClock, format_duration, progress_text

__all__ = ["ProgressBar"]


class ProgressBar:
    """A bar and a line of text, fed from a ProgressState; the bar shows only with a total.

    Example:
        >>> bar = ProgressBar(); bar.show(state)
    """

    def __init__(self) -> None:
        self.clock = RateClock()
        self.started = time.monotonic()
        self.bar = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="300px"))
        self.bar.layout.display = "none"  # no empty bar before a total is known
        self.text = widgets.HTML(self._text(0, None))
        self.text.add_class("nk-progress-text")
        self.widget = widgets.HBox([self.bar, self.text])
        self.widget.add_class("nk-progress")
        self._shown = ("", 0, 0)

    def show(self, state: ProgressState) -> None:
        count, total = state.count, state.expected
        self.clock.observe(count)
        text = self._text(count, total)
        if total:
            self.bar.layout.display = None
            if (self.bar.max, self.bar.value) != (total, min(count, total)):
                with self.bar.hold_sync():
                    self.bar.max, self.bar.value = total, min(count, total)
        if text != self._shown[0]:
            self.text.value = html.escape(text)
            self._shown = (text, count, total or 0)

    def _text(self, count: int, total: int | None) -> str:
        if count:
            return progress_text(count, total, self.clock)
        return f"no steps counted yet · {format_duration(time.monotonic() - self.started)}"
