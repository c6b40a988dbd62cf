"""The live view of a launch in a notebook: its panels laid out in one fixed-height widget.

While the workers train the cell holds one widget, every part sized from the start so that
nothing below the cell moves. The view names no figure: each panel of the recorder
(:mod:`notebook_kit.live.panels`) brings widgets of its own or gets a line at its place when it
first has something to say, and the widgets share their layout and style models
(:mod:`notebook_kit.live.shared_models`). When the run ends the widget is replaced in place by
plain outputs that need no widget state: the panels' summary, their outputs (the plot's PNG),
their details. Everything is drawn from the kernel's main thread at a throttled rate: workers
only write to pipes, and the controls' handlers (the Stop button's) only note the click.
"""

from __future__ import annotations

import contextlib
import html
import importlib
import time
import warnings
from typing import Any

import ipywidgets as widgets
from IPython.display import display

from notebook_kit.live import record
from notebook_kit.live.kernel_status import BusyKeeper, open_route
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, Stream
from notebook_kit.live.panels import PLACES, Panel
from notebook_kit.live.plot_layout import XAxis, check_x_axis
from notebook_kit.live.shared_models import SharedModels
from notebook_kit.runtime.messages import MetricsBatch

__all__ = ["LiveObserver"]

_REFRESH_SECONDS = 0.25  # widgets at most 4 times a second, however often the loop wakes
# The controls' route to a kernel subshell opens once the run has lasted this long, or before
# the first progress is drawn, whichever comes first: nobody clicks sooner, and a short launch
# pays nothing for it.
ROUTE_AFTER = 0.25
# status, header, controls, plot, the speed line (room kept from the start, so the view keeps
# its height when the line appears), tabs, and their margins
BOX_HEIGHT = "602px"
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_EMPTY = {"text/plain": ""}  # what a restart leaves of the last attempt's plot and details


def _load_what_panels_need() -> None:
    """The panels' widget modules load with the view, not mid-run: a launch imports this
    module before it forks, and an interrupt is held while the view is built."""
    for module in sorted({name for panel in record.PANELS for name in panel.needs}):
        importlib.import_module(module)


_load_what_panels_need()


class LiveObserver:
    """Shows a launch live in the cell that started it, and records it for ``last_run()``.

    ``x_axis="epoch"`` draws the plot (and the final PNG) against the logged ``epoch``
    rather than the step, once one is logged; the view's x-axis switch changes it mid-run.
    A panel is an attribute by its name (``view.plot``, ``view.progress``).

    Example::

        notebook_launcher(train, num_processes=2, observer=LiveObserver(x_axis="epoch"))
    """

    def __init__(self, x_axis: XAxis = "step") -> None:
        self.x_axis = check_x_axis(x_axis)
        self.recorder = record.RunRecorder()
        self.info: LaunchInfo | None = None
        self.box: widgets.VBox | None = None
        self.figure: Any = None
        self._handle: Any = None
        self._extras: list[Any] = []  # the panels' outputs and the details under the summary
        self._keeper: BusyKeeper | None = None
        self._new_view()

    def __getattr__(self, name: str) -> Panel:
        panels = self.__dict__.get("recorder")
        for panel in panels.panels if panels is not None else ():
            if panel.name == name:
                return panel
        raise AttributeError(f"{type(self).__name__!r} has no attribute or panel {name!r}")

    def _new_view(self) -> None:
        """Fresh widgets for each attempt (the last one's were closed), shown in the same place."""
        self.shared = SharedModels()
        self.lines: dict[str, widgets.HTML] = {}  # each panel's line widget, by its name
        self._built: dict[str, list[widgets.Widget]] = {place: [] for place in PLACES}
        for panel in self.recorder.panels:
            panel.widget = None
            for place, widget in panel.build(self):
                self._built[place].append(widget)
        self._last_refresh = 0.0
        self._broken = False
        self._route: Any = None
        self.routed: bool | None = None  # whether the controls' clicks reach a busy kernel
        self._shown_at: float | None = None  # set when the view is displayed; None once routed

    def on_start(self, info: LaunchInfo) -> None:
        if self.box is not None:  # a restart: the last attempt's widgets are closed
            self._new_view()
        self.info = info
        self.recorder.start(info)
        header_layout = widgets.Layout(height="36px")
        self.header = widgets.HBox(
            self._built["header"], layout=header_layout, _dom_classes=("nk-header",)
        )
        # A line under the plot, when it appears: two lines high; more (a line per node) scroll.
        status_layout = widgets.Layout(overflow="hidden", height="24px")
        self._layouts = {"status": status_layout, "line": header_layout}
        built = {**self._built, "header": [self.header]}
        self._places = [place for place in PLACES for _ in built[place]]
        parts = [widget for place in PLACES for widget in built[place]]
        box_layout = widgets.Layout(height=BOX_HEIGHT)  # before the parts have rendered, too
        self.box = widgets.VBox(parts, layout=box_layout, _dom_classes=("nk-live",))
        self._leading_tabs = 0
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
        self._keeper = BusyKeeper.start()

    def _route_due(self, shown_at: float) -> bool:
        progress = self.recorder.progress.count or self.recorder.metrics.version
        return bool(progress) or time.monotonic() - shown_at >= ROUTE_AFTER

    def _route_clicks(self) -> None:
        """Open the controls' route, once; its idles are the busy keeper's to hold."""
        self._shown_at = None
        hold = self._keeper.hold_idles_of if self._keeper is not None else None
        controls = tuple(widget for panel in self.recorder.panels for widget in panel.controls)
        self._route = open_route(controls, hold) if controls else None
        self.routed = self._route is not None

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        self.recorder.on_output(rank, stream, line)

    def on_metrics(self, batch: MetricsBatch) -> None:
        self.recorder.on_metrics(batch)

    def on_tick(self) -> None:
        self.recorder.tick()
        if self._shown_at is not None and not self._broken and self._route_due(self._shown_at):
            try:
                self._route_clicks()
            except Exception as error:  # the button then works after the cell, as a hint says
                self.routed = False
                warnings.warn(f"The view's buttons could not be routed: {error!r}", stacklevel=2)
        if self._broken or time.monotonic() - self._last_refresh < _REFRESH_SECONDS:
            return
        self._last_refresh = time.monotonic()
        try:
            self._refresh()
        except Exception as error:  # a display problem must never end the training
            self._broken = True
            warnings.warn(f"Live display stopped updating: {error!r}", stacklevel=2)

    def _refresh(self) -> None:
        for panel in self.recorder.panels:
            panel.draw()
        self._show_panels()

    def _show_panels(self) -> None:
        """Each panel's line at its place, made when it first has something to say: a run
        that counts and logs nothing opens no model for its speed line or its table."""
        if self.box is None:
            return
        for panel in self.recorder.panels:
            value, widget = panel.live_html(), self.lines.get(panel.name)
            if widget is None and value:
                layout = self._layouts.get(panel.place)
                widget = self.shared.html(value, (f"nk-{panel.name}",), layout)
                self.lines[panel.name] = panel.widget = widget
                self._place(panel.place, panel.name, widget)
            elif value and widget is not None and widget.value != value:
                widget.value = value

    def _place(self, place: str, name: str, widget: widgets.Widget) -> None:
        """A line beside the other header widgets, as a tab before the tabs a panel built (the
        ranks'), or in the box after the widgets of its place and those above it."""
        assert self.box is not None
        tabs = next((w for w in self._built["tab"] if isinstance(w, widgets.Tab)), None)
        if place == "header":
            self.header.children = (*self.header.children, widget)
        elif place == "tab" and tabs is not None:
            at, self._leading_tabs = self._leading_tabs, self._leading_tabs + 1
            titles = list(tabs.titles)
            tabs.children = (*tabs.children[:at], widget, *tabs.children[at:])
            tabs.titles = (*titles[:at], name, *titles[at:])
            tabs.selected_index = at
        else:
            rank = PLACES.index(place)
            at = sum(PLACES.index(other) <= rank for other in self._places)
            self._places.insert(at, place)
            self.box.children = (*self.box.children[:at], widget, *self.box.children[at:])

    def on_finish(self, summary: LaunchSummary) -> None:
        route_request = self._route.last_request if self._route is not None else None
        try:
            if not self._broken:
                self._refresh()  # the last points and counts, before the widgets make way
        finally:
            self.figure = self.recorder.finish(summary).figure
        try:
            self._render_static()
        except Exception as error:  # the run's own result or error matters more
            warnings.warn(f"Could not draw the end of the run: {error!r}", stacklevel=2)
        finally:
            if self._keeper is not None:
                self._keeper.wait_for_idle_of(route_request)
                self._keeper.stop()
                self._keeper = None
            self._close_widgets()

    def _render_static(self) -> None:
        """The panels' summary (and the banner), their outputs, their details."""
        panels = self.recorder.panels
        lines = [(panel.summary_html(), text) for panel in panels if (text := panel.summary())]
        banner = self.info.banner if self.info is not None else ""
        body = "".join(part for part, _ in lines) + (
            f'<div class="nk-banner" style="color:#666;font-size:11px">{html.escape(banner)}</div>'
        )
        text = "\n".join(part for part in (*(t for _, t in lines), banner) if part)
        bundle = {"text/html": body, "text/plain": text}
        if self._handle is not None:
            self._handle.update(bundle, raw=True)
        else:  # no display ids outside a kernel: just show it
            display(bundle, raw=True)
        for output in (panel.output() for panel in panels):
            if output:
                self._show_extra(output)
        blocks = [block for panel in panels if (block := panel.details())]
        if blocks:  # the evaluation table, each rank's output: plain HTML and text
            body = f'<div class="nk-details">{"".join(part for part, _ in blocks)}</div>'
            self._show_extra({"text/html": body, "text/plain": "\n".join(t for _, t in blocks)})

    def _show_extra(self, bundle: dict[str, Any]) -> None:
        """Show ``bundle`` under the summary; a restart blanks it (its handle is kept)."""
        handle = display(bundle, raw=True, display_id=True)
        if handle is not None:
            self._extras.append(handle)

    def _close_widgets(self) -> None:
        """The static outputs replaced them: free the models (and the saved widget state)."""
        built = [widget for place in PLACES for widget in self._built[place]]
        for widget in (self.box, *self.lines.values(), *built):
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
