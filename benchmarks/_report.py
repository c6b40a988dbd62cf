"""Turn collected results into a markdown table, a JSON file and a chart."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks._harness import MIB, summarize
from benchmarks._suite import SINGLE_PROCESS, Cell, Results


@dataclass(frozen=True)
class Metric:
    """How a metric is named and shown."""

    title: str
    unit: str
    scale: float = 1.0
    digits: int = 0
    count_of_runs: bool = False  # a yes/no per run, shown as "k/n"


METRICS: dict[str, Metric] = {
    "launch_first": Metric("launch latency, first launch in a fresh process", "ms", 1e3),
    "launch_repeat": Metric("launch latency, repeated launches", "ms", 1e3),
    "step_time": Metric("training step, small CNN", "ms", 1e3, 1),
    "samples_per_s": Metric("training throughput", "samples/s"),
    "core_scaling": Metric("2 procs × 1 thread vs 1 proc × 2 threads (samples/s)", "×", 1, 2),
    "mem_pss": Metric("extra memory per worker, PSS", "MiB", 1 / MIB, 1),
    "mem_uss": Metric("extra memory per worker, USS", "MiB", 1 / MIB, 1),
    "fail_time": Metric("rank raises → caller's exception", "ms", 1e3),
    "fail_shows_error": Metric(
        "exception shows the raising rank's error", "runs", count_of_runs=True
    ),
    "fail_left": Metric("processes still there 1 s after the exception", "processes"),
    "interrupt_caller": Metric("SIGINT to the caller → no worker running", "ms", 1e3),
    "interrupt_group": Metric(
        "SIGINT to the caller's process group → no worker running", "ms", 1e3
    ),
}


def _number(metric: Metric, value: float) -> str:
    if math.isinf(value):
        return "not stopped"
    return f"{value * metric.scale:,.{metric.digits}f}"


def _ratio(cell: Cell, reference: Cell | None) -> str:
    if reference is None or reference.na or not reference.values or cell.na or not cell.values:
        return "—"
    mine, theirs = summarize(cell.values).median, summarize(reference.values).median
    if theirs == 0 or math.isinf(mine) or math.isinf(theirs):
        return "—"
    return f"×{mine / theirs:.2f}"


def _row(metric: Metric, tool: str, cell: Cell, reference: Cell | None) -> list[str]:
    notes = "; ".join(cell.notes)
    if cell.na is not None:
        return [tool, "n/a", "", "", "", f"n/a: {cell.na}"]
    if metric.count_of_runs:
        shown = f"{sum(cell.values):.0f}/{len(cell.values)}"
        return [tool, shown, "", "—", str(len(cell.values)), notes]
    stats = summarize(cell.values)
    spread = f"{_number(metric, stats.low)}–{_number(metric, stats.high)}"
    if math.isinf(stats.low):
        spread = "—"
    median = _number(metric, stats.median)
    return [tool, median, spread, _ratio(cell, reference), str(stats.count), notes]


def markdown_table(results: Results, tools: Sequence[str], reference: str) -> str:
    """One table: every metric, every tool, median, min–max and the ratio to ``reference``."""
    header = ["tool", "median", "min–max", f"vs {reference}", "runs", "notes"]
    lines = [
        "| measurement | " + " | ".join(header) + " |",
        "|---|" + "|".join("---" for _ in header) + "|",
    ]
    for name, metric in METRICS.items():
        cells = results.get(name)
        if not cells:
            continue
        order = [tool for tool in [*tools, SINGLE_PROCESS] if tool in cells]
        for tool in order:
            row = _row(metric, tool, cells[tool], cells.get(reference))
            title = f"{metric.title} ({metric.unit})" if tool == order[0] else ""
            lines.append("| " + " | ".join([title, *row]) + " |")
    return "\n".join(lines)


def machine_description(load_before: tuple[float, ...], load_after: tuple[float, ...]) -> str:
    """The machine and software the numbers were measured on."""
    versions = []
    for package in ("torch", "accelerate", "lightning", "notebook_kit"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} not installed")
    loads = f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    return (
        f"{_cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{', '.join(versions)}; {loads}"
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def save_json(results: Results, path: Path) -> None:
    """Every raw value (infinity written as "inf": JSON has no infinity)."""
    data = {
        metric: {
            tool: {
                "values": ["inf" if math.isinf(value) else value for value in cell.values],
                "na": cell.na,
                "notes": cell.notes,
            }
            for tool, cell in cells.items()
        }
        for metric, cells in results.items()
    }
    path.write_text(json.dumps(data, indent=1))
