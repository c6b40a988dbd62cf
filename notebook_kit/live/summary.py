"""The line that sums a finished run up: how it ended, how long, steps, newest values, restarts.

It heads what a finished run leaves in the cell (plain HTML and text that read without widget
state: GitHub, nbconvert, ``notebook-kit execute`` and a notebook reopened without its kernel
show them), coloured by the outcome; a run without a notebook prints it as its last
progress line.
"""

from __future__ import annotations

import dataclasses
import html
import time

from notebook_kit.errors import WorkerFailure, choose_root_cause
from notebook_kit.live.eval_table import short_number
from notebook_kit.live.metric_names import named_values
from notebook_kit.live.observer import LaunchInfo, LaunchSummary
from notebook_kit.live.panels import Panel
from notebook_kit.live.progress import RateClock, progress_line

__all__ = ["SummaryPanel", "summary_line"]

_SHOWN_METRICS = 3  # newest values in the summary line
_COLOURS = {"success": "#2e7d32", "stopped": "#b26a00", "failed": "#b00020"}
_ICONS = {"success": "✓", "stopped": "■", "failed": "✗"}


def summary_line(
    summary: LaunchSummary,
    steps: int = 0,
    total: int | None = None,
    latest: dict[str, float] | None = None,
    dropped: int = 0,
    restarts: int = 0,
) -> str:
    """One line: how it ended, how long, how many steps, the newest metric values, and how
    often it restarted.

    Example:
        >>> from notebook_kit.live.observer import RankSummary
        >>> done = LaunchSummary((RankSummary(0, 0, 8.4),), 8.46, stopped=True)
        >>> summary_line(done, 460, 1000, {"loss": 0.004603})
        'Finished in 8.5 s · 460/1000 steps · loss 0.004603 · stopped by you'
    """
    parts = [_ending(summary)]
    if steps:
        parts.append(f"{steps}/{total} steps" if total and total > steps else f"{steps} steps")
    parts += named_values(latest or {}, _SHOWN_METRICS, short_number)
    if dropped:
        parts.append(f"{dropped} metric records dropped (log less often)")
    if restarts:
        parts.append(f"after {restarts} restart{'s' if restarts > 1 else ''}")
    if summary.outcome == "stopped":
        parts.append("stopped by you")
    return " · ".join(parts)


def _ending(summary: LaunchSummary) -> str:
    seconds = f"{summary.duration:.1f} s"
    if summary.succeeded:
        return f"Finished in {seconds}"
    workers = "the workers keep their state" if summary.workers_kept else "all workers stopped"
    if summary.timed_out:
        return f"Timed out after {seconds}, {workers}"
    if summary.interrupted:
        return f"Interrupted after {seconds}, {workers}"
    if summary.failures:
        root = choose_root_cause(list(summary.failures))  # the rank the WorkerError names
        others = sorted({failure.rank for failure in summary.failures} - {root.rank})
        line = f"Failed after {seconds}: rank {root.rank} ({_cause(root)})"
        if others:
            line += f", then rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}"
        return line
    return f"Failed after {seconds}"


def _cause(failure: WorkerFailure) -> str:
    """A few words for what ended a rank: its exception, a lost node, or how it exited.

    Example:
        >>> _cause(WorkerFailure(1, None, None, "node 1 lost: its Dask worker left", "", 0.0))
        'node 1 lost'
    """
    if failure.exception_type is not None:
        return failure.exception_type
    if failure.exit_code is None:  # no exit seen: a lost node, a fork that failed
        return failure.message.partition(":")[0]
    if failure.exit_code < 0:  # "died from SIGKILL (9) without a Python exception ..."
        return failure.message.partition(" (")[0]
    return "exited"


class SummaryPanel(Panel):
    """The summary line, coloured by the outcome, heads the end of the run (a restarted
    launch's time is the whole launch's); ``[finished] …`` or ``[stopped] …`` with the rate
    without a notebook."""

    name = "summary"
    place = "status"

    def __init__(self) -> None:
        self.clock = RateClock()  # the rate from the first step, as the progress lines have it
        self.ended: LaunchSummary | None = None
        self._first_start: float | None = None

    def start(self, info: LaunchInfo) -> None:
        if self._first_start is None:
            self._first_start = time.monotonic()

    def tick(self) -> None:
        self.clock.observe(self.run.progress.count)

    def finish(self, summary: LaunchSummary) -> None:
        self.tick()
        self.ended = summary

    def summary(self) -> str:
        if self.ended is None:
            return ""
        ended, restarts = self.ended, len(self.run.attempts) - 1
        if restarts and self._first_start is not None:  # the launch's time, not the attempt's
            ended = dataclasses.replace(ended, duration=time.monotonic() - self._first_start)
        progress, metrics = self.run.progress, self.run.metrics
        latest, dropped = metrics.latest(), metrics.total_dropped
        return summary_line(ended, progress.count, progress.expected, latest, dropped, restarts)

    def summary_html(self) -> str:
        outcome = self.ended.outcome if self.ended is not None else ""
        colour, icon = _COLOURS.get(outcome, "inherit"), _ICONS.get(outcome, "")
        head, _, rest = self.summary().partition(" · ")
        tail = f" · {html.escape(rest)}" if rest else ""
        return (
            f'<div class="nk-summary" style="font-size:13px;padding:2px 0">'
            f'<span style="color:{colour}">{icon} <b>{html.escape(head)}</b></span>{tail}</div>'
        )

    def headless(self) -> str:
        progress, metrics = self.run.progress, self.run.metrics
        if self.ended is None or not (metrics.version or progress.count):
            return ""
        ending = "stopped" if self.ended.stopped else "finished"
        return f"[{ending}] {self.progress_line(self.ended.duration)}"

    def progress_line(self, elapsed: float) -> str:
        """The run's progress line after ``elapsed`` seconds, at the rate from its first step
        (a run without a notebook prints one every few seconds)."""
        progress, metrics = self.run.progress, self.run.metrics
        latest, dropped, rate = metrics.latest(), metrics.total_dropped, self.clock.rate or 0.0
        return progress_line(progress.count, progress.expected, elapsed, latest, dropped, rate)
