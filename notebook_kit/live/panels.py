"""What a figure of the launch view is: a :class:`Panel`.

A panel follows the run (``start`` at each attempt, ``take`` for every typed message a worker
sends, ``tick``, ``finish``; :attr:`Panel.run` is the recorder it reads) and says what it shows
in each place a run is shown, one optional hook per place. The recorder makes one of each class
in its ``PANELS`` list; ``docs/live_view.md`` ("A new figure") says how a figure is added.

In the notebook view a panel shows either a line of HTML (:meth:`Panel.live_html`; the view
makes its widget) or widgets of its own (:meth:`Panel.build`), redrawn in :meth:`Panel.draw`.

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
from collections.abc import Sequence
from typing import Any, ClassVar

from notebook_kit.live.observer import LaunchInfo, LaunchSummary
from notebook_kit.runtime.messages import OutputLine, WorkerMessage

__all__ = ["PLACES", "Panel"]

# The places of the notebook view, top to bottom: the status line, the row of the Stop button,
# the plot's rows, the lines under the plot, the tabs at the bottom.
PLACES = ("status", "header", "body", "line", "tab")


class Panel:
    """One figure of the launch view; the defaults say nothing."""

    name: ClassVar[str]  # its key in ``last_run().panels``, its CSS class ``nk-…``, its tab
    place: ClassVar[str] = "line"  # where the notebook view shows its line (one of PLACES)
    # Modules its widgets import: loaded with the notebook view, before the workers fork.
    needs: ClassVar[tuple[str, ...]] = ()
    run: Any = None  # the RunRecorder that made it (set there; typed loosely: it imports us)
    widget: Any = None  # its line's widget in the notebook view, once made (set there)
    # Widgets of its own the user acts on while the cell runs (a button): served on a kernel
    # subshell, their handlers run there; draw() does the work on the main thread.
    controls: Sequence[Any] = ()

    def start(self, info: LaunchInfo) -> None:
        """An attempt starts: the first, or a restart after a failure."""

    def take(self, message: WorkerMessage | OutputLine) -> None:
        """A typed message a worker sent (a panel picks the classes it cares about); the
        notebook view also hands over each line a worker printed."""

    def tick(self) -> None:
        """At least every quarter second while the workers run."""

    def finish(self, summary: LaunchSummary) -> None:
        """Every worker of the attempt ended."""

    def build(self, view: Any) -> list[tuple[str, Any]]:
        """Widgets of its own for a new notebook view, each with its place (one of PLACES);
        ``view.shared`` holds the layout and style models they may share."""
        return []

    def draw(self) -> None:
        """The notebook view redraws (on the main thread, at most four times a second)."""

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

    def summary(self) -> str:
        """Lines in the end-of-run summary ("": none); those of a panel shown under the plot
        are under the saved plot too."""
        return ""

    def summary_html(self) -> str:
        """Its lines in the summary as HTML; by default :meth:`summary`, escaped."""
        return (
            f'<div class="nk-{self.name}" style="font-size:12px;color:#444;'
            f'white-space:pre-line">{html.escape(self.summary())}</div>'
        )

    def output(self) -> dict[str, Any] | None:
        """An output of its own under the summary at the end (a mime bundle), if any."""
        return None

    def details(self) -> tuple[str, str] | None:
        """``(html, text)`` of its block among the details under the summary, if any."""
        return None

    def headless(self) -> str:
        """What a run without a notebook prints of it at the end ("": nothing)."""
        return ""

    def record(self) -> Any:
        """What ``last_run().panels`` keeps of it, under :attr:`name`; called once every
        panel has finished."""
        return None
