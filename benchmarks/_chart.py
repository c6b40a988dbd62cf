"""A bar chart of the results: one panel per metric, median bars with min–max whiskers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display, works headless and in CI

import matplotlib.pyplot as plt  # (after choosing the backend)

from benchmarks._harness import summarize
from benchmarks._report import METRICS
from benchmarks._suite import SINGLE_PROCESS, Results

_COLUMNS = 3


def save_chart(results: Results, tools: Sequence[str], path: Path, title: str) -> None:
    """Write the chart to ``path`` (PNG)."""
    names = [
        name for name, metric in METRICS.items() if results.get(name) and not metric.count_of_runs
    ]
    rows = max(1, math.ceil(len(names) / _COLUMNS))
    figure, axes = plt.subplots(
        rows, _COLUMNS, figsize=(5.2 * _COLUMNS, 0.5 + 2.6 * rows), squeeze=False
    )
    every_tool = [*tools, SINGLE_PROCESS]
    colors = {tool: f"C{index}" for index, tool in enumerate(every_tool)}  # same in every panel
    for axis, name in zip(axes.flat, names, strict=False):
        _panel(axis, results, name, every_tool, colors)
    for axis in list(axes.flat)[len(names) :]:
        axis.set_visible(False)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _panel(
    axis: plt.Axes, results: Results, name: str, tools: Sequence[str], colors: dict[str, str]
) -> None:
    metric = METRICS[name]
    cells = results[name]
    shown = [tool for tool in tools if tool in cells]
    finite = [v for tool in shown for v in cells[tool].values if not math.isinf(v)]
    ceiling = max(finite, default=1.0) * metric.scale * 1.15 or 1.0
    for position, tool in enumerate(shown):
        cell = cells[tool]
        if cell.na is not None or not cell.values:
            axis.text(0, position, " n/a", va="center", fontsize=7, color="gray")
            continue
        stats = summarize(cell.values)
        if math.isinf(stats.median):
            axis.barh(position, ceiling, color="lightgray", hatch="//")
            axis.text(0, position, " not stopped", va="center", fontsize=7)
            continue
        low = stats.median - stats.low
        high = stats.high - stats.median if not math.isinf(stats.high) else 0.0
        axis.barh(
            position,
            stats.median * metric.scale,
            color=colors[tool],
            xerr=[[low * metric.scale], [high * metric.scale]],
            capsize=3,
        )
    axis.set_xlim(0, max(ceiling, axis.get_xlim()[1]))
    axis.set_yticks(range(len(shown)), shown, fontsize=7)
    axis.invert_yaxis()
    axis.set_title(f"{metric.title} ({metric.unit})", fontsize=8)
    axis.tick_params(axis="x", labelsize=7)
