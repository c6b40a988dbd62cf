"""What a finished run leaves in the cell: a one-line summary and the final PNG, as plain
outputs (HTML and text) that read without widget state; the panels' details go below them.

GitHub, nbconvert, ``notebook-kit execute`` and a notebook reopened without its kernel show
these; the widgets of the live view are closed once they are in place.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from notebook_kit.errors import WorkerFailure, choose_root_cause
from notebook_kit.live.eval_table import short_number
from notebook_kit.live.metric_names import joined, named_values
from notebook_kit.live.observer import LaunchSummary

__all__ = ["figure_bundle", "summary_bundle", "summary_line"]

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


def summary_bundle(
    line: str, outcome: str, banner: str, panels: Sequence[tuple[str, str]] = ()
) -> dict[str, str]:
    """The summary as HTML (coloured by outcome, each panel's ``(name, text)`` and the launch
    banner below) and as text (the same lines)."""
    colour = _COLOURS.get(outcome, "inherit")
    icon = _ICONS.get(outcome, "")
    head, _, rest = line.partition(" · ")
    tail = f" · {html.escape(rest)}" if rest else ""
    body = (
        f'<div class="nk-summary" style="font-size:13px;padding:2px 0">'
        f'<span style="color:{colour}">{icon} <b>{html.escape(head)}</b></span>{tail}</div>'
        f"{''.join(_panel_html(name, text) for name, text in panels)}"
        f'<div class="nk-banner" style="color:#666;font-size:11px">{html.escape(banner)}</div>'
    )
    texts = [text for _, text in panels]
    text = "\n".join(part for part in (line, *texts, banner) if part)
    return {"text/html": body, "text/plain": text}


def _panel_html(name: str, text: str) -> str:
    """A panel's lines (the speed line) as the saved notebook shows them."""
    return (
        f'<div class="nk-{name}" style="font-size:12px;color:#444;white-space:pre-line">'
        f"{html.escape(text)}</div>"
    )


def figure_bundle(png: bytes, names: list[str], unit: str) -> dict[str, Any]:
    """The final plot: the PNG, with a one-line text fallback."""
    return {"image/png": png, "text/plain": f"<plot of {joined(names, _SHOWN_METRICS)} by {unit}>"}
