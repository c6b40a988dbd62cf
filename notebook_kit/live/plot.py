"""The plot's drawing: two browser widgets while the run goes, a matplotlib figure at the end.

While it runs the kernel never draws: ``plot_widget.js`` (an anywidget) draws the points it is
sent on a canvas, and ``plot_controls.js`` holds the user's choices (smoothing, y axis, x axis),
which the plot reads in the browser; :class:`~notebook_kit.live.plot_widget.LivePlot` makes and
feeds them. The final plot, what stays in the saved notebook as a PNG, is laid out like the
live one (:mod:`notebook_kit.live.plot_layout` decides for both), with the x axis, smoothing and
y scale the user chose while it ran; it is built with matplotlib's object API on an Agg canvas:
no pyplot state, nothing shared with the user's own figures, nothing shown twice.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Collection
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as widgets
import traitlets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from notebook_kit.live.metric_names import more_text, short_name
from notebook_kit.live.plot_layout import (
    PlotPanel,
    YScale,
    axis_limits,
    ema,
    epoch_positions,
    plan_panels,
    thinned,
    use_log,
)

__all__ = ["PlotControls", "PlotWidget", "draw_metrics", "figure_png", "new_figure"]

_FOOTER_POINTS = 7.5  # the speed lines under the panels

History = list[tuple[int, float]]
_MAX_POINTS = 4000  # per line; longer histories are thinned before drawing
_COLUMNS = 3


def new_figure(panels: int, width: float = 9.0, row_height: float = 2.9) -> Figure:
    """An Agg-backed figure sized for ``panels`` panels (3 to a row).

    Example:
        >>> new_figure(2).get_size_inches().tolist()
        [9.0, 2.9]
    """
    rows = max(1, -(-panels // _COLUMNS))
    figure = Figure(figsize=(width, row_height * rows), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def draw_metrics(
    figure: Figure,
    histories: dict[str, History],
    *,
    x_label: str = "step",
    evals: Collection[str] = (),
    smoothing: float = 0.0,
    y_scale: YScale = "auto",
    panels: list[PlotPanel] | None = None,
    x_metric: str | None = None,
    marks: Collection[tuple[int, str]] = (),
    footer: str = "",
) -> None:
    """Draw every metric on ``figure``: one axes per panel, legend, labelled axes.

    Args:
        figure: The figure to draw on (cleared first).
        histories: ``(step, value)`` per metric, in step order.
        x_label: The unit the steps count: ``"step"`` or ``"epoch"``.
        evals: Metrics drawn as markers (evaluation rounds), never smoothed.
        smoothing: EMA weight for the other metrics (0: raw); the raw line stays, faded.
        y_scale: ``"log"``, ``"linear"``, or ``"auto"``: log where positive values span more
            than a thousandfold.
        panels: The layout; default :func:`~notebook_kit.live.plot_layout.plan_panels`.
        x_metric: A logged position (``epoch``) to draw against instead of the step: each
            point at the epoch its step falls on
            (:func:`~notebook_kit.live.plot_layout.epoch_positions`).
        marks: ``(step, label)`` drawn as dashed vertical lines: where each restart resumed.
        footer: Text written under the panels (the speed figures), the figure made taller
            to hold it.

    Example:
        >>> figure = new_figure(1)
        >>> draw_metrics(figure, {"loss": [(0, 1.0), (1, 0.5)], "val_loss": [(1, 0.6)]},
        ...              evals={"val_loss"})
    """
    figure.clear()
    panels = panels if panels is not None else plan_panels(histories)
    if not panels:
        return
    colours = {name: f"C{i % 10}" for i, name in enumerate(n for p in panels for n in p.names)}
    along = histories.get(x_metric, []) if x_metric is not None else []
    columns = min(len(panels), _COLUMNS)
    rows = -(-len(panels) // columns)
    for index, panel in enumerate(panels):
        axes = figure.add_subplot(rows, columns, index + 1)
        values: list[float] = []
        steps: list[float] = []
        for name in panel.names:
            history = histories.get(name, [])
            xs, ys = thinned(history, _MAX_POINTS)
            if along:
                xs = epoch_positions(xs, along)
            colour, label = colours[name], short_name(name)
            if name in evals or len(history) < 2:
                axes.plot(xs, ys, "o-", color=colour, markersize=4, linewidth=1, label=label)
            elif smoothing > 0:
                axes.plot(xs, ys, color=colour, alpha=0.25, linewidth=1)
                axes.plot(xs, ema(ys, smoothing), color=colour, linewidth=1.5, label=label)
            else:
                axes.plot(xs, ys, color=colour, linewidth=1.5, label=label)
            values += ys
            steps += xs
        if panel.more:  # a legend entry with no line: the family's metrics not drawn
            axes.plot([], [], " ", label=more_text(panel.more))
        for step, text in marks:
            at = epoch_positions([step], along)[0] if along else step
            axes.axvline(at, color="0.45", linestyle="--", linewidth=1)
            axes.annotate(
                text, (at, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -10),
                textcoords="offset points", fontsize=7, color="0.35",
            )  # fmt: skip
        whole = not along  # steps are whole numbers, a logged epoch need not be
        _style(axes, panel.label, x_label, values, steps, use_log(values, y_scale), whole)
    if not footer:
        figure.tight_layout()
        return
    width, height = figure.get_size_inches()
    fits = int(width * 72 / (_FOOTER_POINTS * 0.55))  # characters a line holds, about
    footer = "\n".join(textwrap.fill(line, fits) for line in footer.splitlines())
    room = 0.2 * (footer.count("\n") + 1) + 0.1  # inches of text under the panels
    figure.set_size_inches(width, height + room)
    figure.text(
        0.01, 0.05 / (height + room), footer, fontsize=_FOOTER_POINTS, color="0.25", va="bottom"
    )
    figure.tight_layout(rect=(0, room / (height + room), 1, 1))


def _style(
    axes: Any,
    label: str,
    x_label: str,
    values: list[float],
    steps: list[float],
    log: bool,
    whole: bool = True,
) -> None:
    if log:
        axes.set_yscale("log")
    limits = axis_limits(values, log=log)
    if limits is not None:
        axes.set_ylim(*limits)
    if steps and min(steps) == max(steps):
        axes.set_xlim(steps[0] - 1, steps[0] + 1)
    axes.xaxis.set_major_locator(MaxNLocator(integer=whole))  # logged steps are whole
    axes.set_xlabel(x_label, fontsize=9)
    axes.set_ylabel(f"{label} (log)" if log else label, fontsize=9)
    axes.tick_params(labelsize=8)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="best")


def figure_png(figure: Figure) -> bytes:
    """The figure as PNG bytes.

    Example:
        >>> figure_png(new_figure(1))[:4]
        b'\\x89PNG'
    """
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


_CONTROLS_HEIGHT = 34  # pixels, the row of controls above the plot
_CSS = """
.nk-plot-area { display: flex; flex-wrap: wrap; width: 100%; }
.nk-plot-panel { display: block; cursor: crosshair; }
"""
_CONTROLS_CSS = f"""
.nk-plot-controls {{ height: {_CONTROLS_HEIGHT}px; display: flex; align-items: center;
  gap: 18px; font-size: var(--jp-widgets-font-size, 13px); }}
.nk-plot-controls label {{ display: inline-flex; align-items: center; gap: 6px; }}
.nk-plot-controls input[type=range] {{ width: 140px; }}
"""


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
    _anywidget_id = traitlets.Unicode("notebook_kit.live.plot_widget.PlotWidget").tag(sync=True)
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
    _anywidget_id = traitlets.Unicode("notebook_kit.live.plot_widget.PlotControls").tag(sync=True)
    smoothing = traitlets.Float(0.0).tag(sync=True)  # TensorBoard's EMA weight, 0 to 0.99
    y_scale = traitlets.Int(0).tag(sync=True)  # index into Y_SCALES
    x_axis = traitlets.Unicode("step").tag(sync=True)  # one of X_AXES
    plot = traitlets.Unicode("").tag(sync=True)  # the PlotWidget's model id
