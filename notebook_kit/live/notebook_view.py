"""The live view of a launch in a notebook: Stop button, progress bar, worker output, plot.

Everything is drawn from the kernel's main thread, on the launcher's tick, at a throttled rate:
workers only write to pipes, and the Stop button's click handler only sets the stop flag.
"""

from __future__ import annotations

import html
import time
import warnings
from typing import Any

import ipywidgets as widgets
from IPython.display import display

from notebook_kit.live.observer import LaunchInfo, LaunchSummary, Stream
from notebook_kit.live.plot import LivePlot
from notebook_kit.live.progress import ProgressBar
from notebook_kit.live.rank_output import ERROR_COLOUR, RankOutput
from notebook_kit.live.record import RunRecorder
from notebook_kit.live.stop_button import StopButton

__all__ = ["LiveObserver"]

_REFRESH_SECONDS = 0.25  # widgets at most 4 times a second, however often the loop wakes


class LiveObserver:
    """Shows a launch live in the cell that started it, and records it for ``last_run()``.

    Example:
        >>> notebook_launcher(train, num_processes=2, observer=LiveObserver())
    """

    def __init__(self) -> None:
        self.recorder = RunRecorder()
        self.plot = LivePlot()
        self.status = widgets.HTML()
        self.status.add_class("nk-status")
        self.info: LaunchInfo | None = None
        self.stop: StopButton | None = None
        self.progress: ProgressBar | None = None
        self.output: RankOutput | None = None
        self.box: widgets.VBox | None = None
        self._last_refresh = 0.0
        self._stopping_shown = False
        self._broken = False

    def on_start(self, info: LaunchInfo) -> None:
        self.info = info
        self.stop = StopButton(info.stop_flag)
        self.progress = ProgressBar()
        self.output = RankOutput(info.ranks)
        self.status.value = html.escape(info.banner)
        header = widgets.HBox([self.stop.widget, self.progress.widget])
        self.box = widgets.VBox([self.status, header, self.output.widget])
        self.box.add_class("nk-live")
        display(self.box)
        self.stop.serve_during_run()

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        if self.output is not None:
            self.output.add(rank, stream, line)

    def on_message(self, rank: int, kind: str, payload: Any) -> None:
        self.recorder.on_message(rank, kind, payload)

    def on_tick(self) -> None:
        if self._broken or time.monotonic() - self._last_refresh < _REFRESH_SECONDS:
            return
        self._last_refresh = time.monotonic()
        try:
            self._refresh()
        except Exception as error:  # a display problem must never end the training
            self._broken = True
            warnings.warn(f"Live display stopped updating: {error!r}", stacklevel=2)

    def _refresh(self) -> None:
        info = self.info
        if info is not None and not self._stopping_shown and info.stop_flag.is_set():
            self._stopping_shown = True
            if self.stop is not None:
                self.stop.show_stopping()
        if self.progress is not None:
            self.progress.show(self.recorder.progress)
        if self.output is not None:
            self.output.refresh()
        dropped = self.recorder.metrics.total_dropped
        if dropped:
            self.status.value = (
                f"{html.escape(info.banner if info else '')} · <b>{dropped} metric records "
                "dropped</b> (the kernel could not keep up; log less often)"
            )
        self.plot.refresh(self.recorder.metrics)

    def on_finish(self, summary: LaunchSummary) -> None:
        outcome = summary.outcome
        try:
            if self.stop is not None:
                self.stop.finish()
            if self.progress is not None:
                self.progress.close(self.recorder.progress, outcome)
            if self.output is not None:
                self.output.finish(summary.ranks)
            self.plot.finish(self.recorder.metrics)
            self.status.value = _ending(summary, self.recorder.metrics.total_dropped)
        finally:
            drawn = self.plot.figure if self.recorder.metrics.values else None
            self.recorder.finish(summary, figure=drawn)


def _ending(summary: LaunchSummary, dropped: int) -> str:
    """The status line once the run is over."""
    seconds = f"{summary.duration:.1f} s"
    if summary.outcome == "stopped":
        text = f"Stopped by request after {seconds}; the function returned normally."
    elif summary.succeeded:
        text = f"Finished in {seconds}."
    elif summary.timed_out:
        text = f"Timed out after {seconds}; all workers were stopped."
    elif summary.interrupted:
        text = f"Interrupted after {seconds}; all workers were stopped."
    else:
        failed = [str(f.rank) for f in summary.failures] or ["?"]
        text = f"Failed after {seconds}: rank {', '.join(failed)} (details below)."
    colour = ERROR_COLOUR if summary.outcome == "failed" else "inherit"
    note = f" {dropped} metric records were dropped." if dropped else ""
    return f'<span style="color:{colour}">{html.escape(text + note)}</span>'
