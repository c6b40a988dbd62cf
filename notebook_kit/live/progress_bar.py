"""The head of the live view: the status line, and the progress bar beside the Stop button.

The status line is the launch's banner, with a warning once metric records were dropped. The
bar shows once a total is known, with a line of text: before the first step it says it is
waiting; without a total it shows the steps done and the rate, never an empty ``0/?`` bar. Bar
and text are one HTML widget (one model, one message per change), drawn like ipywidgets' own.
"""

from __future__ import annotations

import html
import time

from notebook_kit.live.observer import LaunchInfo
from notebook_kit.live.panels import Panel
from notebook_kit.live.progress import RateClock, format_duration, progress_text

__all__ = ["ProgressPanel", "StatusPanel"]

_TRACK = (
    "display:inline-block;flex:0 0 300px;height:18px;margin-right:8px;overflow:hidden;"
    "border-radius:2px;background:var(--jp-layout-color3,#eee)"
)
_BAR = "height:100%;background:var(--jp-brand-color1,#1976d2)"
_ROW = "display:flex;align-items:center;height:28px;white-space:nowrap"


class StatusPanel(Panel):
    """The status line at the top of the live view: the banner, and dropped records."""

    name = "status"
    place = "status"
    banner = ""

    def start(self, info: LaunchInfo) -> None:
        self.banner = info.banner

    def live_html(self) -> str:
        dropped = self.run.metrics.total_dropped
        note = f"{dropped} metric records dropped (the kernel could not keep up; log less)"
        extra = f" · <b>{html.escape(note)}</b>" if dropped else ""
        return (
            '<div style="white-space:nowrap;overflow:hidden;text-overflow:ellipsis">'
            f"{html.escape(self.banner)}{extra}</div>"
        )


class ProgressPanel(Panel):
    """The bar and its text, from the recorder's ProgressState; each attempt has its own rate.

    Example::

        panel = ProgressPanel(); panel.run = recorder; panel.live_html()
    """

    name = "progress"
    place = "header"

    def __init__(self) -> None:
        self.start(None)

    def start(self, info: LaunchInfo | None) -> None:
        self.clock = RateClock()
        self.started = time.monotonic()
        self.text = self._text(0, None)
        self.fraction: float | None = None  # of the total done; None: no total, no bar

    def live_html(self) -> str:
        count, total = self.run.progress.count, self.run.progress.expected
        self.clock.observe(count)
        self.text = self._text(count, total)
        self.fraction = min(count, total) / total if total else None
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
