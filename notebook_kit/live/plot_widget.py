"""The live plot: a small browser widget fed with only the new points, its controls, the PNG.

The kernel's share of drawing is folding metrics into means (:class:`PointFeed`) and sending
the steps that changed a few times a second; the browser draws them on a canvas
(:mod:`notebook_kit.live.plot`). The controls (smoothing, y axis, and the x axis once an
``epoch`` is logged) are a second small widget: the plot reads them in the browser, so moving
one redraws without a round trip, and their own comm is the one a kernel subshell serves while
the cell runs, so the kernel knows the user's choice for the final PNG (:meth:`LivePlot.drawing`).
The widgets and matplotlib load with the notebook view only (``LivePlot.needs``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from notebook_kit.live.metric_names import joined, short_name
from notebook_kit.live.panels import Panel
from notebook_kit.live.plot_layout import (
    PlotPanel,
    XUnit,
    axis_metric,
    eval_metrics,
    infer_x_unit,
    plan_panels,
    thinned,
)
from notebook_kit.runtime.messages import MetricsBatch, OutputLine, WorkerMessage

__all__ = ["Y_SCALES", "LivePlot", "PointFeed", "Points"]

Y_SCALES = ("auto", "linear", "log")  # the y-axis choices, in the order the browser knows

Points = dict[str, tuple[list[float], list[float]]]  # name -> (steps, means)
_KEPT_STEPS = 1024  # per metric: the steps whose sums are kept for late-arriving ranks
PLOT_HEIGHT = 250  # pixels, fixed for the whole run
_SNAPSHOT_SECONDS = 15.0  # full data for views opened mid-run, this often
_SNAPSHOT_POINTS = 2000  # per metric in a snapshot
_NAMED = 3  # metrics named in the PNG's text fallback
_WAITING = "The plot starts with the first accelerator.log(...)"


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


class LivePlot(Panel):
    """The plot row of the live view (controls above a fixed-height plot), and the final PNG,
    kept as ``last_run().figure``.

    The view's ``x_axis`` (``"epoch"``) draws against the logged ``epoch`` from the start; the
    user can switch back in the view. Each attempt's view goes on from the earlier points,
    with a mark where each restart resumed.

    Example::

        plot = LivePlot(); plot.run = recorder; plot.build(view)
        plot.take(MetricsBatch(0, ((0, 0, {"loss": 1.0}),))); plot.draw()
    """

    name = "plot"
    place = "body"
    needs = ("notebook_kit.live.plot",)

    def __init__(self) -> None:
        self.feed = PointFeed()
        self.marks: list[list[Any]] = []  # [step, label] where each restart resumed
        self.x_unit: XUnit = "step"
        self.plot: Any = None  # the canvas (and the controls), once a view is built
        self.controls_widget: Any = None
        self.widgets: list[Any] = []
        self.figure: Any = None  # the final figure, once the run ended
        self._shown_spec: dict[str, Any] = {}
        self._snapshot_at = 0.0
        self._marked = 0  # restarts marked so far

    def build(self, view: Any) -> list[tuple[str, Any]]:
        import ipywidgets as widgets

        from notebook_kit.live.plot import PlotControls, PlotWidget

        earlier, self.x_unit = self.plot is not None, "step"
        self.controls_widget = PlotControls(
            x_axis=view.x_axis, layout=view.shared.layout, _dom_classes=("nk-plot-controls",)
        )
        self.plot = PlotWidget(
            spec=_spec([], [], "step", None),
            controls=self.controls_widget.model_id,
            layout=widgets.Layout(height=f"{PLOT_HEIGHT}px"),  # before the script arrives
            _dom_classes=("nk-plot",),
        )
        self.controls_widget.plot = self.plot.model_id  # before any route: from here, never
        self.widgets = [self.controls_widget, self.plot]
        self._shown_spec, self._snapshot_at = self.plot.spec, time.monotonic()
        self.run.plot = self  # the evaluation table asks which metrics are evaluations
        if earlier:  # a restart's view: every point so far, and the marks
            self.resume()
        return [(self.place, widget) for widget in self.widgets]

    @property
    def controls(self) -> list[Any]:  # type: ignore[override]
        """The widgets whose values the user changes during the run."""
        return [self.controls_widget] if self.controls_widget is not None else []

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

    def take(self, message: WorkerMessage | OutputLine) -> None:
        if self.plot is None or not isinstance(message, MetricsBatch):
            return
        restarts = self.run.restarts
        if len(restarts) > self._marked:  # a restart logs these steps again: they replace the old
            self.resume(drop_from=restarts[-1][0])
        self.feed.add_batch(message)

    def resume(self, drop_from: int | None = None) -> None:
        """Go on from earlier attempts: every point so far, and a mark at each restart; the points
        from ``drop_from`` on are dropped here and in the browser (a restart logs them again)."""
        if drop_from is not None:
            self.feed.drop_from(drop_from)
        self._marked = len(self.run.restarts)
        self.marks = [[step, label] for step, label in self.run.restarts]
        self._shown_spec = {}  # the next refresh sends the spec, with the marks
        self.plot.snapshot = snapshot(self.run.metrics.histories())
        self._snapshot_at = time.monotonic()

    def draw(self) -> None:
        """Send the points that changed, and a new layout when metrics or the unit changed."""
        if self.plot is None:
            return
        progress = self.run.progress
        unit = infer_x_unit(self.feed.last_step, progress.steps, progress.epoch_length)
        if unit == "epoch" or progress.steps >= (progress.epoch_length or 0) * 2:
            self.x_unit = unit  # settled once a unit shows or two epochs passed
        names = list(self.feed.names)
        x_metric = self.x_metric
        spec = _spec(names, eval_metrics(self.feed.counts), self.x_unit, x_metric)
        if self.marks:
            spec["marks"] = self.marks
        if spec != self._shown_spec:  # with x_metric, the controls offer the x-axis switch
            self._shown_spec = self.plot.spec = spec
        points = self.feed.take()
        if points:
            self.plot.send({"points": _json_points(points)})
        if time.monotonic() - self._snapshot_at > _SNAPSHOT_SECONDS:
            self._snapshot_at = time.monotonic()
            self.plot.snapshot = snapshot(self.run.metrics.histories())

    @property
    def evals(self) -> list[str]:
        return eval_metrics(self.feed.counts)

    def record(self) -> Any:
        """The final figure, drawn as the user last saw the plot, with the lines that were
        under it (every panel has finished: their lines are final). None without a view."""
        self.figure = self._final_figure() if self.plot is not None else None
        return self.figure

    def _final_figure(self) -> Any:
        from notebook_kit.live.plot import draw_metrics, new_figure

        histories = self.run.metrics.histories()
        if not histories:
            return None
        figure = new_figure(len(plan_panels(histories)))
        lines = [panel.summary() for panel in self.run.panels if panel.place == "line"]
        footer = "\n".join(line for line in lines if line)
        draw_metrics(figure, histories, **self.drawing(), marks=self.run.restarts, footer=footer)
        return figure

    def output(self) -> dict[str, Any] | None:
        """The final PNG, with a one-line text fallback."""
        if self.figure is None:
            return None
        from notebook_kit.live.plot import figure_png

        names = joined(list(self.run.metrics.histories()), _NAMED)
        unit = self.drawing()["x_label"]
        return {"image/png": figure_png(self.figure), "text/plain": f"<plot of {names} by {unit}>"}


def _spec(names: list[str], evals: list[str], unit: XUnit, x_metric: str | None) -> dict[str, Any]:
    panels = [_panel_spec(panel) for panel in plan_panels(names)]
    spec = {"panels": panels, "eval": evals, "x_label": unit, "waiting": _WAITING}
    spec["height"] = PLOT_HEIGHT
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
