"""The live view of a launch in a notebook: status, Stop and progress, plot, table, output.

While the workers train the cell holds one fixed-height widget, every part sized from the start
so that nothing below the cell moves. The panels (:mod:`notebook_kit.live.panels`) each get a
widget at their place when they first have something to say, and the widgets share their layout
and style models (:mod:`notebook_kit.live.shared_models`). When the run ends the widget is
replaced in place by plain outputs that need no widget state (:mod:`notebook_kit.live.summary`).
Everything is drawn from the kernel's main thread at a throttled rate: workers only write to
pipes, and the Stop button's click handler only sets the flag.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from typing import Any

import ipywidgets as widgets
from IPython.display import display

from notebook_kit.live.kernel_status import BusyKeeper
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, Stream
from notebook_kit.live.plot import draw_metrics, figure_png, new_figure
from notebook_kit.live.plot_layout import plan_panels
from notebook_kit.live.plot_widget import LivePlot, XAxis, check_x_axis
from notebook_kit.live.rank_output import RankOutput
from notebook_kit.live.record import RunRecorder
from notebook_kit.live.shared_models import SharedModels
from notebook_kit.live.stop_button import StopButton
from notebook_kit.live.summary import figure_bundle, summary_bundle, summary_line
from notebook_kit.runtime.messages import MetricsBatch

__all__ = ["LiveObserver"]

_REFRESH_SECONDS = 0.25  # widgets at most 4 times a second, however often the loop wakes
# The Stop button's route to a kernel subshell opens once the run has lasted this long, or before
# the first progress is drawn, whichever comes first: nobody clicks sooner, and a short launch
# pays nothing for it.
ROUTE_AFTER = 0.25
# status, header, controls, plot, the speed line (room kept from the start, so the view keeps
# its height when the line appears), tabs, and their margins
BOX_HEIGHT = "602px"
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_EMPTY = {"text/plain": ""}  # what a restart leaves of the last attempt's plot and details


class LiveObserver:
    """Shows a launch live in the cell that started it, and records it for ``last_run()``.

    ``x_axis="epoch"`` draws the plot (and the final PNG) against the logged ``epoch``
    rather than the step, once one is logged; the view's x-axis switch changes it mid-run.

    Example::

        notebook_launcher(train, num_processes=2, observer=LiveObserver(x_axis="epoch"))
    """

    def __init__(self, x_axis: XAxis = "step") -> None:
        self.x_axis = check_x_axis(x_axis)
        self.recorder = RunRecorder()
        self.info: LaunchInfo | None = None
        self.stop: StopButton | None = None
        self.output: RankOutput | None = None
        self.box: widgets.VBox | None = None
        self.header: widgets.Box | None = None
        self._layouts: dict[str, widgets.Layout] = {}  # a place's own layout, by place
        self.figure: Any = None
        self._handle: Any = None
        self._extras: list[Any] = []  # the plot's PNG and the details under the summary
        self._first_shown: float | None = None  # when the launch's first attempt was shown
        self._keeper: BusyKeeper | None = None
        self._new_view()

    def _new_view(self) -> None:
        """Fresh widgets for each attempt (the last one's were closed), shown in the same place;
        the plot goes on from the earlier attempts' points, with a mark at each restart."""
        self.shared = SharedModels()
        earlier = getattr(self, "plot", None)
        self.plot = LivePlot(
            x_axis=self.x_axis,
            layout=self.shared.layout,
            feed=earlier.feed if earlier is not None else None,
        )
        if earlier is not None:
            self.plot.resume(self.recorder.metrics, self.recorder.restarts)
        self.recorder.plot = self.plot
        self.lines: dict[str, widgets.HTML] = {}  # each panel's widget, by its name
        self._last_refresh = 0.0
        self._stopping_shown = False
        self._broken = False
        self._shown_at: float | None = None  # set when the view is displayed; None once routed

    def on_start(self, info: LaunchInfo) -> None:
        if self.box is not None:  # a restart: the last attempt's widgets are closed
            self._new_view()
        self.info = info
        self.recorder.start(info)
        shared = self.shared
        self.stop = StopButton(info.stop_flag, shared)
        self.output = RankOutput(info.ranks, info.node_of(), shared)
        header_layout = widgets.Layout(height="36px")
        self.header = shared.box([self.stop.button], ("nk-header",), header_layout)
        # A line under the plot, when it appears: two lines high; more (a line per node) scroll.
        status_layout = widgets.Layout(overflow="hidden", height="24px")
        self._layouts = {"status": status_layout, "line": header_layout}
        parts = [self.header, self.stop.note, *self.plot.widgets, self.output.widget]
        box_layout = widgets.Layout(height=BOX_HEIGHT)  # before the parts have rendered, too
        self.box = widgets.VBox(parts, layout=box_layout, _dom_classes=("nk-live",))
        self._show_panels()  # the status line and the progress: they have their say at once
        fallback = f"{info.banner} (live view; a summary replaces it when the run ends)"
        view = {"version_major": 2, "version_minor": 0, "model_id": self.box.model_id}
        bundle = {_WIDGET_VIEW: view, "text/plain": fallback}
        if self._handle is not None:  # a restart: in place of the last attempt's summary
            self._handle.update(bundle, raw=True)
            for extra in self._extras:
                extra.update(_EMPTY, raw=True)
            self._extras = []
        else:
            self._handle = display(bundle, raw=True, display_id=True)
        self._shown_at = time.monotonic()
        if self._first_shown is None:
            self._first_shown = self._shown_at
        self._keeper = BusyKeeper.start()

    def _route_due(self, shown_at: float) -> bool:
        progress = self.recorder.progress.count or self.recorder.metrics.version
        return bool(progress) or time.monotonic() - shown_at >= ROUTE_AFTER

    def _route_clicks(self) -> None:
        """Open the Stop button's route, once; its idles are the busy keeper's to hold."""
        self._shown_at = None
        hold = self._keeper.hold_idles_of if self._keeper is not None else None
        if self.stop is not None:
            self.stop.serve_during_run(*self.plot.controls, hold_idles=hold)

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        if self.output is not None:
            self.output.add(rank, stream, line)

    def on_metrics(self, batch: MetricsBatch) -> None:
        resumed = self.recorder.on_metrics(batch)
        if resumed is not None:  # a restart logs these steps again: they replace the old
            self.plot.resume(self.recorder.metrics, self.recorder.restarts, drop_from=resumed)
        self.plot.feed.add_batch(batch)

    @property
    def progress(self) -> Any:
        """The progress panel (its ``text`` and ``fraction``); ``.widget``: its bar here."""
        panel = next(panel for panel in self.recorder.panels if panel.name == "progress")
        panel.widget = self.lines.get("progress")  # type: ignore[attr-defined]
        return panel

    def on_tick(self) -> None:
        self.recorder.tick()
        if self._shown_at is not None and not self._broken and self._route_due(self._shown_at):
            try:
                self._route_clicks()
            except Exception as error:  # the button then works after the cell, as a hint says
                warnings.warn(f"Stop button could not be routed: {error!r}", stacklevel=2)
        if self._broken or time.monotonic() - self._last_refresh < _REFRESH_SECONDS:
            return
        self._last_refresh = time.monotonic()
        try:
            self._refresh()
        except Exception as error:  # a display problem must never end the training
            self._broken = True
            warnings.warn(f"Live display stopped updating: {error!r}", stacklevel=2)

    def _refresh(self) -> None:
        info, stop = self.info, self.stop
        stopping = info is not None and info.stop_flag.is_set()
        if stopping and stop is not None and not self._stopping_shown:
            self._stopping_shown = True
            stop.show_stopping()
        if self.output is not None:
            self.output.refresh()
        self.plot.refresh(self.recorder.metrics, self.recorder.progress)
        self._show_panels()

    def _show_panels(self) -> None:
        """Each panel's widget at its place, made when it first has something to say: a run
        that counts and logs nothing opens no model for its speed line or its table."""
        if self.box is None or self.header is None or self.output is None:
            return
        for panel in self.recorder.panels:
            value, widget = panel.live_html(), self.lines.get(panel.name)
            if widget is None and value:
                layout = self._layouts.get(panel.place)
                widget = self.shared.html(value, (f"nk-{panel.name}",), layout)
                self.lines[panel.name] = widget
                self._place(panel.place, panel.name, widget)
            elif value and widget is not None and widget.value != value:
                widget.value = value

    def _place(self, place: str, name: str, widget: widgets.HTML) -> None:
        assert self.box is not None and self.header is not None and self.output is not None
        if place == "tab":  # before the ranks' tabs
            self.output.add_leading_tab(name, widget)
        elif place == "header":  # beside the Stop button
            self.header.children = (*self.header.children, widget)
        else:  # the status line on top, a line above the tabs
            parts = list(self.box.children)
            parts.insert(0 if place == "status" else parts.index(self.output.widget), widget)
            self.box.children = tuple(parts)

    def on_finish(self, summary: LaunchSummary) -> None:
        route_request = None
        try:
            if not self._broken:
                self._refresh()  # the last points and counts, before the widgets make way
            if self.stop is not None:
                route_request = self.stop.finish()
            self.figure = self._final_figure()
        finally:
            self.recorder.finish(summary, figure=self.figure)
        try:
            self._render_static(summary)
        except Exception as error:  # the run's own result or error matters more
            warnings.warn(f"Could not draw the end of the run: {error!r}", stacklevel=2)
        finally:
            if self._keeper is not None:
                self._keeper.wait_for_idle_of(route_request)
                self._keeper.stop()
                self._keeper = None
            self._close_widgets()

    def _final_figure(self) -> Any:
        histories = self.recorder.metrics.histories()
        if not histories:
            return None
        figure = new_figure(len(plan_panels(histories)))
        draw_metrics(
            figure,
            histories,
            **self.plot.drawing(),
            marks=self.recorder.restarts,
            footer="\n".join(text for _, text in self.recorder.texts("summary")),
        )
        return figure

    def _render_static(self, summary: LaunchSummary) -> None:
        metrics, progress = self.recorder.metrics, self.recorder.progress
        if self.output is not None:
            self.output.finish(summary.ranks)
        restarts = len(self.recorder.attempts) - 1
        if restarts and self._first_shown is not None:  # the launch's time, not the attempt's
            summary = dataclasses.replace(summary, duration=time.monotonic() - self._first_shown)
        line = summary_line(
            summary,
            progress.count,
            progress.expected,
            metrics.latest(),
            metrics.total_dropped,
            restarts,
        )
        banner = self.info.banner if self.info is not None else ""
        bundle = summary_bundle(line, summary.outcome, banner, self.recorder.texts("summary"))
        if self._handle is not None:
            self._handle.update(bundle, raw=True)
        else:  # no display ids outside a kernel: just show it
            display(bundle, raw=True)
        if self.figure is not None:
            names = list(metrics.histories())
            png = figure_bundle(figure_png(self.figure), names, self.plot.drawing()["x_label"])
            self._show_extra(png)
        blocks = [block for panel in self.recorder.panels if (block := panel.details())]
        if self.output is not None and self.output.static_html():
            blocks.append((self.output.static_html(), self.output.text()))
        if blocks:  # the evaluation table, each rank's output: plain HTML and text
            html = f'<div class="nk-details">{"".join(part for part, _ in blocks)}</div>'
            self._show_extra({"text/html": html, "text/plain": "\n".join(t for _, t in blocks)})

    def _show_extra(self, bundle: dict[str, Any]) -> None:
        """Show ``bundle`` under the summary; a restart blanks it (its handle is kept)."""
        handle = display(bundle, raw=True, display_id=True)
        if handle is not None:
            self._extras.append(handle)

    def _close_widgets(self) -> None:
        """The static outputs replaced them: free the models (and the saved widget state)."""
        extra = [] if self.stop is None else [self.stop.button, self.stop.note]
        for widget in (self.box, *self.lines.values(), *self.plot.widgets, *extra):
            if widget is not None:
                close_tree(widget)


def close_tree(widget: widgets.Widget) -> None:
    """Close ``widget`` and every widget below it (children, tab panes), once each.

    Text is emptied first: some savers (nbclient) keep the last state of closed widgets, and
    the run's output already stands in the cell as plain text.
    """
    for child in getattr(widget, "children", ()):
        close_tree(child)
    if isinstance(widget, widgets.HTML) and widget.comm is not None and widget.value:
        widget.value = ""
    parts = [getattr(widget, name, None) for name in ("layout", "style")]  # models of their own
    for part in (widget, *parts):
        if isinstance(part, widgets.Widget):
            with contextlib.suppress(KeyError):  # already closed, or never opened (no kernel)
                part.close()
