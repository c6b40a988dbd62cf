"""The live plot: a small browser widget fed with only the new points, and its controls.

The kernel's share of drawing is folding metrics into means (:class:`PointFeed`) and sending
the steps that changed a few times a second; the browser draws them on a canvas
(``plot_widget.js``, an anywidget). The smoothing slider and the log-scale box are linked to
the plot in the browser, so moving them redraws without a round trip, and the kernel reads
their values for the final PNG. The y axis is logarithmic where positive values span more than
a thousandfold (a falling loss stays readable), unless the user picks linear or log.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as widgets
import traitlets

from notebook_kit.live.metrics import MetricsAggregator
from notebook_kit.live.panels import XUnit, eval_metrics, infer_x_unit, plan_panels
from notebook_kit.live.plot_feed import PointFeed, Points
from notebook_kit.live.progress import ProgressState

__all__ = ["Y_SCALES", "LivePlot", "PlotWidget"]

Y_SCALES = ("auto", "linear", "log")  # the y-axis choices, in the order the browser knows

PLOT_HEIGHT = 250  # pixels, fixed for the whole run
_SNAPSHOT_SECONDS = 15.0  # full data for views opened mid-run, this often
_SNAPSHOT_POINTS = 2000  # per metric in a snapshot
_WAITING = "The plot starts with the first accelerator.log(...)"
_CSS = """
.nk-plot-area { display: flex; flex-wrap: wrap; width: 100%; }
.nk-plot-panel { display: block; cursor: crosshair; }
"""


class PlotWidget(anywidget.AnyWidget):
    """Canvas plot in the browser; new points arrive as ``{"points": {name: [xs, ys]}}``.

    Example:
        >>> plot = PlotWidget(spec={"panels": [{"label": "loss", "names": ["loss"]}]})
        >>> plot.send({"points": {"loss": [[0, 1], [1.0, 0.5]]}})
    """

    _esm = Path(__file__).with_name("plot_widget.js")
    _css = _CSS
    spec = traitlets.Dict().tag(sync=True)  # panels, evaluation metrics, x label, height
    snapshot = traitlets.Dict().tag(sync=True)  # every point, for views opened later
    smoothing = traitlets.Float(0.0).tag(sync=True)
    y_scale = traitlets.Int(0).tag(sync=True)  # index into Y_SCALES


class LivePlot:
    """The plot row of the live view: controls above a fixed-height plot.

    Example:
        >>> plot = LivePlot(); plot.on_message(0, "log", {"step": 0, "values": {"loss": 1.0}})
        >>> plot.refresh(metrics, progress)
    """

    def __init__(self, height: int = PLOT_HEIGHT) -> None:
        self.feed = PointFeed()
        self.x_unit: XUnit = "step"
        self.plot = PlotWidget(spec=_spec([], [], "step", height))
        self.plot.add_class("nk-plot")
        self.plot.layout.height = f"{height}px"  # before the browser has loaded the script
        self.smoothing = widgets.FloatSlider(
            value=0.0, min=0.0, max=0.99, step=0.01, description="smoothing",
            readout_format=".2f", style={"description_width": "initial"},
            layout=widgets.Layout(width="260px"),
        )  # fmt: skip
        self.y_scale = widgets.Dropdown(
            options=list(Y_SCALES), value="auto", description="y axis",
            tooltip="auto: log once positive values span 1000×",
            layout=widgets.Layout(width="150px"), style={"description_width": "initial"},
        )  # fmt: skip
        self._links = [
            widgets.jslink((self.smoothing, "value"), (self.plot, "smoothing")),
            widgets.jslink((self.y_scale, "index"), (self.plot, "y_scale")),
        ]
        controls = widgets.HBox(
            [self.smoothing, self.y_scale], layout=widgets.Layout(height="34px")
        )
        controls.add_class("nk-plot-controls")
        self.widget = widgets.VBox([controls, self.plot])
        self._height = height
        self._shown_spec = self.plot.spec
        self._snapshot_at = time.monotonic()

    @property
    def controls(self) -> list[widgets.Widget]:
        """The widgets whose values the user changes during the run."""
        return [self.smoothing, self.y_scale]

    def on_message(self, rank: int, kind: str, payload: Any) -> None:
        self.feed.add_message(rank, kind, payload)

    def refresh(self, metrics: MetricsAggregator, progress: ProgressState) -> None:
        """Send the points that changed, and a new layout when metrics or the unit changed."""
        unit = infer_x_unit(self.feed.last_step, progress.steps, progress.epoch_length)
        if unit == "epoch" or progress.steps >= (progress.epoch_length or 0) * 2:
            self.x_unit = unit  # settled once a unit shows or two epochs passed
        names = list(self.feed.names)
        spec = _spec(names, eval_metrics(self.feed.counts), self.x_unit, self._height)
        if spec != self._shown_spec:
            self._shown_spec = self.plot.spec = spec
        points = self.feed.take()
        if points:
            self.plot.send({"points": _json_points(points)})
        if time.monotonic() - self._snapshot_at > _SNAPSHOT_SECONDS:
            self._snapshot_at = time.monotonic()
            self.plot.snapshot = snapshot(metrics.histories())

    @property
    def evals(self) -> list[str]:
        return eval_metrics(self.feed.counts)

    @property
    def links(self) -> list[widgets.Widget]:
        """The browser-side links between the controls and the plot."""
        return list(self._links)


def _spec(names: list[str], evals: list[str], unit: XUnit, height: int) -> dict[str, Any]:
    panels = [{"label": p.label, "names": list(p.names)} for p in plan_panels(names)]
    return {"panels": panels, "eval": evals, "x_label": unit, "height": height, "waiting": _WAITING}


def _json_points(points: Points) -> dict[str, list[list[float | None]]]:
    """JSON has no NaN or infinity: they travel as null and leave a gap in the line."""
    return {
        name: [list(steps), [v if math.isfinite(v) else None for v in values]]
        for name, (steps, values) in points.items()
    }


def snapshot(histories: dict[str, list[tuple[int, float]]]) -> dict[str, Any]:
    """Every metric as ``[steps, values]``, thinned to a few thousand points each.

    Example:
        >>> snapshot({"loss": [(0, 1.0), (1, 0.5)]})
        {'loss': [[0, 1], [1.0, 0.5]]}
    """
    shown: dict[str, Any] = {}
    for name, history in histories.items():
        stride = max(1, len(history) // _SNAPSHOT_POINTS)
        points = history[::stride]
        if points and points[-1] != history[-1]:
            points.append(history[-1])
        shown.update(_json_points({name: ([s for s, _ in points], [v for _, v in points])}))
    return shown
