"""The live loss plot: a matplotlib figure redrawn in the launching cell while workers train.

The figure is built with matplotlib's object API on an Agg canvas (no pyplot state, nothing
shared with the user's own figures) and sent as a PNG through one display id, so every redraw
replaces the previous image and the last one stays in the saved notebook. Related metrics share
an axes (``loss`` with ``val_loss``); metrics logged much less often than the densest one are
drawn with markers.
"""

from __future__ import annotations

import io
import re
import time
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from notebook_kit.live.metrics import MetricsAggregator

__all__ = ["LivePlot", "draw_metrics", "update_metrics"]

_REDRAW_SECONDS = 1.0  # at most one redraw per second
# A redraw (mostly Agg rendering) takes tens of milliseconds of a core that the workers may
# need: wait at least this many times the last redraw's duration before the next one.
_RENDER_SHARE_LIMIT = 20
_MAX_POINTS = 2000  # per line; longer histories are thinned before drawing
_SPLIT_PREFIX = re.compile(r"^(train|training|val|valid|validation|eval|test)[_/.\-]", re.I)
_LOG_SCALE_RANGE = 1000.0  # positive values spanning more than this get a log axis
_SPARSE_RATIO = 0.2  # a metric with fewer points than this share of the densest gets markers


def metric_group(name: str) -> str:
    """``"val_loss"`` and ``"train/loss"`` both belong to the ``"loss"`` axes."""
    return _SPLIT_PREFIX.sub("", name) or name


def draw_metrics(figure: Figure, histories: dict[str, list[tuple[int, float]]]) -> None:
    """Draw every metric on ``figure``: one axes per group, steps on x.

    Example:
        >>> figure = Figure(); draw_metrics(figure, {"loss": [(0, 1.0), (1, 0.5)]})
    """
    figure.clear()
    groups: dict[str, list[str]] = {}
    for name in histories:
        groups.setdefault(metric_group(name), []).append(name)
    if not groups:
        return
    columns = min(len(groups), 3)
    rows = -(-len(groups) // columns)
    for index, (group, names) in enumerate(groups.items()):
        axes = figure.add_subplot(rows, columns, index + 1)
        for name in names:
            axes.plot([], [], markersize=4, label=name)
        axes.set_title(group, fontsize=10)
        axes.set_xlabel("step", fontsize=9)
        axes.tick_params(labelsize=8)
        axes.grid(alpha=0.3)
        if len(names) > 1:
            axes.legend(fontsize=8)
    update_metrics(figure, histories)
    figure.tight_layout()  # once per layout: it is the slowest part of a redraw


def update_metrics(figure: Figure, histories: dict[str, list[tuple[int, float]]]) -> None:
    """Put new data into the lines ``draw_metrics`` made, rescaling each axes.

    Example:
        >>> update_metrics(figure, {"loss": [(0, 1.0), (1, 0.5), (2, 0.4)]})
    """
    densest = max((len(history) for history in histories.values()), default=0)
    for axes in figure.axes:
        values: list[float] = []
        for line in axes.lines:
            history = histories.get(str(line.get_label()), [])
            steps, ys = _thinned(history)
            line.set_data(steps, ys)
            sparse = len(history) < _SPARSE_RATIO * densest or len(history) < 3
            line.set_marker("o" if sparse else "None")
            values.extend(value for _, value in history)
        positive_span = values and min(values) > 0 and max(values) > _LOG_SCALE_RANGE * min(values)
        axes.set_yscale("log" if positive_span else "linear")  # falling losses stay readable
        axes.relim()
        axes.autoscale_view()


def _thinned(history: list[tuple[int, float]]) -> tuple[list[int], list[float]]:
    if not history:
        return [], []
    stride = max(1, len(history) // _MAX_POINTS)
    points = history[::stride]
    if stride > 1 and points[-1] != history[-1]:
        points.append(history[-1])  # always show the newest value
    return [step for step, _ in points], [value for _, value in points]


class LivePlot:
    """A figure in the cell's output, redrawn from a MetricsAggregator at a throttled rate.

    Example:
        >>> plot = LivePlot(); plot.refresh(metrics); plot.finish(metrics)
    """

    def __init__(self, width: float = 7.0, height: float = 3.2) -> None:
        self.figure = Figure(figsize=(width, height), dpi=90)
        FigureCanvasAgg(self.figure)
        self._handle: Any = None
        self._drawn_version = -1
        self._names: list[str] = []
        self._last_draw = 0.0
        self._draw_seconds = 0.0

    def refresh(self, metrics: MetricsAggregator, force: bool = False) -> None:
        """Redraw if the metrics changed and the last redraw is old enough (or ``force``)."""
        if metrics.version == self._drawn_version or not metrics.values:
            return
        pause = max(_REDRAW_SECONDS, _RENDER_SHARE_LIMIT * self._draw_seconds)
        if not force and time.monotonic() - self._last_draw < pause:
            return
        started = time.monotonic()
        self._drawn_version = metrics.version
        histories = metrics.histories()
        if list(histories) != self._names:  # a new metric: lay the figure out again
            self._names = list(histories)
            draw_metrics(self.figure, histories)
        else:
            update_metrics(self.figure, histories)
        self._publish()
        self._last_draw = time.monotonic()
        self._draw_seconds = self._last_draw - started

    def finish(self, metrics: MetricsAggregator) -> None:
        """Draw the final state; it stays in the cell's output."""
        self.refresh(metrics, force=True)

    def png(self) -> bytes:
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        return buffer.getvalue()

    def _publish(self) -> None:
        from IPython.display import display

        data = {"image/png": self.png(), "text/plain": "<notebook_kit live plot>"}
        if self._handle is None:
            self._handle = display(data, raw=True, display_id=True)
        else:
            self._handle.update(data, raw=True)
