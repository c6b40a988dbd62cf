"""What a figure of the launch view is: a :class:`Panel`.

A panel follows the run (``start`` at each attempt, ``take`` for every typed message a worker
sends, ``tick``, ``finish``; :attr:`Panel.run` is the recorder it reads) and says what it shows
in each place a run is shown, one optional hook per place. The recorder makes one of each class
in its ``PANELS`` list; ``docs/live_view.md`` ("A new figure") says how a figure is added.

Example::

    class Batches(Panel):
        name = "batches"
        count = 0

        def take(self, message):
            self.count += isinstance(message, MetricsBatch)

        def headless(self):
            return f"[batches] {self.count}"
"""

from __future__ import annotations

import html
from typing import Any, ClassVar

from notebook_kit.live.observer import LaunchInfo, LaunchSummary
from notebook_kit.runtime.messages import WorkerMessage

__all__ = ["Panel"]


class Panel:
    """One figure of the launch view; the defaults say nothing."""

    name: ClassVar[str]  # its key in ``last_run().panels``, its CSS class ``nk-…``, its tab
    # Where the notebook view shows it: "status", "header", "line" (under the plot) or "tab".
    place: ClassVar[str] = "line"
    run: Any = None  # the RunRecorder that made it (set there; typed loosely: it imports us)

    def start(self, info: LaunchInfo) -> None:
        """An attempt starts: the first, or a restart after a failure."""

    def take(self, message: WorkerMessage) -> None:
        """A typed message a worker sent (a panel picks the classes it cares about)."""

    def tick(self) -> None:
        """At least every quarter second while the workers run."""

    def finish(self, summary: LaunchSummary) -> None:
        """Every worker of the attempt ended."""

    def live(self) -> str:
        """Text of its line under the plot in the notebook view now ("": no line yet)."""
        return ""

    def live_html(self) -> str:
        """Its widget's HTML in the view now ("": no widget yet); by default :meth:`live`."""
        text = self.live()
        return text and (
            '<div style="white-space:pre-wrap;font-size:12px;line-height:16px;max-height:34px;'
            f'overflow-y:auto">{html.escape(text)}</div>'
        )

    def details(self) -> tuple[str, str] | None:
        """``(html, text)`` of its block among the details under the summary, if any."""
        return None

    def summary(self) -> str:
        """Lines under the end-of-run summary line and the saved plot ("": none)."""
        return ""

    def headless(self) -> str:
        """What a run without a notebook prints of it at the end ("": nothing)."""
        return ""

    def record(self) -> Any:
        """What ``last_run().panels`` keeps of it, under :attr:`name`."""
        return None
