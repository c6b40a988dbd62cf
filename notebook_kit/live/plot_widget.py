"""The live plot: a small browser widget fed with only the new points, and its controls.

The kernel's share of drawing is folding metrics into means (:class:`PointFeed`) and sending
the steps that changed a few times a second; the browser draws them on a canvas
(``plot_widget.js``, an anywidget). The controls (smoothing, y axis, and the x axis once an
``epoch`` is logged) are a second small widget (``plot_controls.js``): the plot reads them in
the browser, so moving one redraws without a round trip, and their own comm is the one a
kernel subshell serves while the cell runs, so the kernel knows the user's choice for the
final PNG (:meth:`LivePlot.drawing`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import anywidget
import ipywidgets as widgets
import traitlets

from notebook_kit.live.metric_names import short_name
from notebook_kit.live.metrics import MetricsAggregator
from notebook_kit.live.plot_layout import (
    PlotPanel,
    XUnit,
    axis_metric,
    eval_metrics,
    infer_x_unit,
    plan_panels,
    thinned,
)
from notebook_kit.live.progress import ProgressState
from notebook_kit.runtime.messages import MetricsBatch

__all__ = ["X_AXES", "Y_SCALES", "LivePlot", "PlotControls", "PlotWidget", "PointFeed", "Points"]

Y_SCALES = ("auto", "linear", "log")  # the y-axis choices, in the order the browser knows
X_AXES = ("step", "epoch")  # the x-axis choices: the logged step, or the logged epoch
XAxis = Literal["step", "epoch"]

Points = dict[str, tuple[list[float], list[float]]]  # name -> (steps, means)
_KEPT_STEPS = 1024  # per metric: the steps whose sums are kept for late-arriving ranks
PLOT_HEIGHT = 250  # pixels, fixed for the whole run
CONTROLS_HEIGHT = 34  # pixels, the row of controls above the plot
_SNAPSHOT_SECONDS = 15.0  # full data for views opened mid-run, this often
_SNAPSHOT_POINTS = 2000  # per metric in a snapshot
_WAITING = "The plot starts with the first accelerator.log(...)"
_CSS = """
.nk-plot-area { display: flex; flex-wrap: wrap; width: 100%; }
.nk-plot-panel { display: block; cursor: crosshair; }
"""
_CONTROLS_CSS = f"""
.nk-plot-controls {{ height: {CONTROLS_HEIGHT}px; display: flex; align-items: center;
  gap: 18px; font-size: var(--jp-widgets-font-size, 13px); }}
.nk-plot-controls label {{ display: inline-flex; align-items: center; gap: 6px; }}
.nk-plot-controls input[type=range] {{ width: 140px; }}
"""


class PointFeed:
    """Folds metrics messages into means per step; hands out what changed.

    The kernel never re-sends a history: :meth:`take` hands over only the steps that changed
    since the last call. A step whose mean changes later (the other rank's value arrived in a
    later batch) is sent again and replaces the point in the browser. Only the most recent
    steps of each metric keep their sums, so memory stays bounded however long the run; the
    final picture is drawn from the full record (:class:`MetricsAggregator`), not from here.

    Example:
        >>> feed = PointFeed()
        >>> feed.add_batch(MetricsBatch(0, ((0, 3, {"loss": 1.0}), (1, 3, {"loss": 3.0}))))
        >>> feed.take()
        {'loss': ([3], [2.0])}
    """

    def __init__(self, kept_steps: int = _KEPT_STEPS) -> None:
        self.kept_steps = kept_steps
        self.counts: dict[str, int] = {}  # distinct steps seen per metric
        self.last_step: int | None = None  # newest step rank 0 logged
        self._sums: dict[str, dict[int, list[float]]] = {}  # name -> step -> [sum, count]
        self._changed: dict[str, set[int]] = {}
        self._auto_steps: dict[int, int] = {}

    def add_batch(self, batch: MetricsBatch) -> None:
        for record_rank, step, values in batch.records:
            self._add(record_rank, step, values)

    def _add(self, rank: int, step: int | None, values: Mapping[str, float]) -> None:
        # Numbered like MetricsAggregator: step=None counts that rank's calls.
        step = self._auto_steps.get(rank, 0) if step is None else int(step)
        self._auto_steps[rank] = step + 1
        if rank == 0:
            self.last_step = step if self.last_step is None else max(self.last_step, step)
        for name, value in values.items():
            by_step = self._sums.setdefault(name, {})
            entry = by_step.get(step)
            if entry is None:
                by_step[step] = [value, 1.0]
                self.counts[name] = self.counts.get(name, 0) + 1
                if len(by_step) > 2 * self.kept_steps:
                    self._forget_oldest(by_step)
            else:
                entry[0] += value
                entry[1] += 1
            self._changed.setdefault(name, set()).add(step)

    def _forget_oldest(self, by_step: dict[int, list[float]]) -> None:
        for step in sorted(by_step)[: len(by_step) - self.kept_steps]:
            del by_step[step]

    def drop_from(self, step: int) -> None:
        """Forget the steps from ``step`` on (a restarted run logs them again)."""
        for name, by_step in self._sums.items():
            gone = [s for s in by_step if s >= step]
            for s in gone:
                del by_step[s]
            self.counts[name] = max(self.counts.get(name, 0) - len(gone), 0)
            self._changed.get(name, set()).difference_update(gone)
        if self.last_step is not None and self.last_step >= step:
            self.last_step = step - 1 if step > 0 else None

    def take(self) -> Points:
        """The points changed since the last call, by metric, in step order."""
        points: Points = {}
        for name, steps in self._changed.items():
            by_step = self._sums[name]
            kept = sorted(step for step in steps if step in by_step)
            if kept:
                points[name] = (kept, [by_step[s][0] / by_step[s][1] for s in kept])
        self._changed.clear()
        return points

    @property
    def names(self) -> Iterable[str]:
        """Every metric seen, in the order it first appeared."""
        return self._sums.keys()


class _ClassTraitsWidget(anywidget.AnyWidget):
    """An anywidget whose script, style and id are traits of its class.

    ``AnyWidget.__init__`` adds them to each instance with ``add_traits``, which makes a new
    class every time and costs milliseconds per view; declared on the class they cost nothing.
    """

    def __init__(self, **kwargs: Any) -> None:
        widgets.DOMWidget.__init__(self, **kwargs)


def _script(name: str) -> str:
    return Path(__file__).with_name(name).read_text(encoding="utf-8")


class PlotWidget(_ClassTraitsWidget):
    """Canvas plot in the browser; new points arrive as ``{"points": {name: [xs, ys]}}``.

    ``controls`` is the model id of the :class:`PlotControls` it reads (smoothing, axes).

    Example:
        >>> plot = PlotWidget(spec={"panels": [{"label": "loss", "names": ["loss"]}]})
        >>> plot.send({"points": {"loss": [[0, 1], [1.0, 0.5]]}})
    """

    _esm = traitlets.Unicode(_script("plot_widget.js")).tag(sync=True)
    _css = traitlets.Unicode(_CSS).tag(sync=True)
    _anywidget_id = traitlets.Unicode(f"{__name__}.PlotWidget").tag(sync=True)
    spec = traitlets.Dict().tag(sync=True)  # panels, evaluation metrics, x label, height
    snapshot = traitlets.Dict().tag(sync=True)  # every point, for views opened later
    controls = traitlets.Unicode("").tag(sync=True)  # the PlotControls' model id


class PlotControls(_ClassTraitsWidget):
    """The plot's controls, drawn in the browser: smoothing, y axis, and the x axis once the
    plot's spec names a logged epoch (``plot`` is the plot's model id, read in the browser).

    Nothing publishes them from the kernel's main thread once the run is under way: a comm's
    messages go to the kernel subshell that last published on it, and the main shell is busy
    with the cell until the run ends.

    Example:
        >>> controls = PlotControls(x_axis="epoch")
        >>> controls.smoothing, controls.y_scale, controls.x_axis
        (0.0, 0, 'epoch')
    """

    _esm = traitlets.Unicode(_script("plot_controls.js")).tag(sync=True)
    _css = traitlets.Unicode(_CONTROLS_CSS).tag(sync=True)
    _anywidget_id = traitlets.Unicode(f"{__name__}.PlotControls").tag(sync=True)
    smoothing = traitlets.Float(0.0).tag(sync=True)  # TensorBoard's EMA weight, 0 to 0.99
    y_scale = traitlets.Int(0).tag(sync=True)  # index into Y_SCALES
    x_axis = traitlets.Unicode("step").tag(sync=True)  # one of X_AXES
    plot = traitlets.Unicode("").tag(sync=True)  # the PlotWidget's model id


def check_x_axis(x_axis: str) -> XAxis:
    """``x_axis`` if it is one of :data:`X_AXES`, else a ValueError naming the choices.

    Example:
        >>> check_x_axis("epoch")
        'epoch'
    """
    if x_axis not in X_AXES:
        raise ValueError(
            f"x_axis must be 'step' or 'epoch', got {x_axis!r}: 'epoch' draws the plot "
            "against the logged epoch (once one is logged), 'step' against the logged step."
        )
    return x_axis  # type: ignore[return-value]


class LivePlot:
    """The plot row of the live view: controls above a fixed-height plot.

    ``x_axis="epoch"`` draws against the logged ``epoch`` from the start (the user can switch
    back in the view); ``layout`` is a layout model the controls may share with other widgets.

    Example::

        plot = LivePlot(); plot.feed.add_batch(MetricsBatch(0, ((0, 0, {"loss": 1.0}),)))
        plot.refresh(metrics, progress)
    """

    def __init__(
        self,
        height: int = PLOT_HEIGHT,
        x_axis: XAxis = "step",
        layout: widgets.Layout | None = None,
        feed: PointFeed | None = None,
    ) -> None:
        self.feed = feed if feed is not None else PointFeed()  # an earlier attempt's goes on
        self.marks: list[list[Any]] = []  # [step, label] where each restart resumed
        self.x_unit: XUnit = "step"
        self.controls_widget = PlotControls(
            x_axis=check_x_axis(x_axis),
            layout=layout if layout is not None else widgets.Layout(),
            _dom_classes=("nk-plot-controls",),
        )
        self.plot = PlotWidget(
            spec=_spec([], [], "step", height, None),
            controls=self.controls_widget.model_id,
            layout=widgets.Layout(height=f"{height}px"),  # before the browser has the script
            _dom_classes=("nk-plot",),
        )
        self.controls_widget.plot = self.plot.model_id  # before any route: from here, never
        self.widgets: list[widgets.Widget] = [self.controls_widget, self.plot]
        self._height = height
        self._shown_spec = self.plot.spec
        self._snapshot_at = time.monotonic()

    @property
    def controls(self) -> list[widgets.Widget]:
        """The widgets whose values the user changes during the run."""
        return [self.controls_widget]

    @property
    def x_metric(self) -> str | None:
        """The logged ``epoch`` the plot can be drawn against, once one is logged by step."""
        return axis_metric(self.feed.names) if self.x_unit == "step" else None

    def drawing(self) -> dict[str, Any]:
        """What the user chose, as ``draw_metrics``' arguments for the final PNG: the x axis
        (``epoch`` where chosen and logged), smoothing (TensorBoard's EMA weight), y axis."""
        index = self.controls_widget.y_scale
        epoch = self.controls_widget.x_axis == "epoch" and self.x_metric is not None
        return {
            "x_label": "epoch" if epoch else self.x_unit,
            "evals": set(self.evals),
            "smoothing": min(max(float(self.controls_widget.smoothing), 0.0), 0.99),
            "y_scale": Y_SCALES[index] if 0 <= index < len(Y_SCALES) else "auto",
            "x_metric": self.x_metric if epoch else None,
        }

    def resume(
        self,
        metrics: MetricsAggregator,
        restarts: list[tuple[int, str]],
        drop_from: int | None = None,
    ) -> None:
        """Go on from earlier attempts: every point so far, and a mark at each restart; the points
        from ``drop_from`` on are dropped here and in the browser (a restart logs them again)."""
        if drop_from is not None:
            self.feed.drop_from(drop_from)
        self.marks = [[step, label] for step, label in restarts]
        self._shown_spec = {}  # the next refresh sends the spec, with the marks
        self.plot.snapshot = snapshot(metrics.histories())
        self._snapshot_at = time.monotonic()

    def refresh(self, metrics: MetricsAggregator, progress: ProgressState) -> None:
        """Send the points that changed, and a new layout when metrics or the unit changed."""
        unit = infer_x_unit(self.feed.last_step, progress.steps, progress.epoch_length)
        if unit == "epoch" or progress.steps >= (progress.epoch_length or 0) * 2:
            self.x_unit = unit  # settled once a unit shows or two epochs passed
        names = list(self.feed.names)
        x_metric = self.x_metric
        spec = _spec(names, eval_metrics(self.feed.counts), self.x_unit, self._height, x_metric)
        if self.marks:
            spec["marks"] = self.marks
        if spec != self._shown_spec:  # with x_metric, the controls offer the x-axis switch
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


def _spec(
    names: list[str], evals: list[str], unit: XUnit, height: int, x_metric: str | None
) -> dict[str, Any]:
    panels = [_panel_spec(panel) for panel in plan_panels(names)]
    spec = {"panels": panels, "eval": evals, "x_label": unit, "height": height, "waiting": _WAITING}
    if x_metric is not None:
        spec["x_metric"] = x_metric  # the logged epoch, which the x axis can show instead
    return spec


def _panel_spec(panel: PlotPanel) -> dict[str, Any]:
    """A panel for the browser: its label and names, the count of its family's metrics not
    drawn (``more``) and the shortened names (``short``), each only when there are any."""
    spec: dict[str, Any] = {"label": panel.label, "names": list(panel.names)}
    short = {name: short_name(name) for name in panel.names if short_name(name) != name}
    if panel.more:
        spec["more"] = panel.more
    if short:
        spec["short"] = short
    return spec


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
    return _json_points({name: thinned(h, _SNAPSHOT_POINTS) for name, h in histories.items()})
