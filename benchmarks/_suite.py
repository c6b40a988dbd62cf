"""Run measurements for several tools, interleaved run by run, and collect the results."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from benchmarks import _measure
from benchmarks._harness import reap_children, rotated
from benchmarks._measure import NotApplicable, Options, Outcome
from benchmarks._tools import Tool

# The training reference run in the caller, shown as its own row.
SINGLE_PROCESS = "1 process (no launcher)"


@dataclass
class Cell:
    """All runs of one metric for one tool."""

    values: list[float] = field(default_factory=list)
    na: str | None = None  # why there is no number
    notes: list[str] = field(default_factory=list)


Results = dict[str, dict[str, Cell]]  # metric -> tool name -> cell


@dataclass(frozen=True)
class Measurement:
    run: Callable[[Tool, Options], Outcome]
    metrics: tuple[str, ...]
    warm_up: bool = False  # one unrecorded run per tool first (the first launch is its own)


MEASUREMENTS: dict[str, Measurement] = {
    "first": Measurement(_measure.first_launch, ("launch_first",)),
    "launch": Measurement(_measure.launch, ("launch_repeat",), warm_up=True),
    "train": Measurement(_measure.train, ("step_time", "samples_per_s", "core_scaling")),
    "memory": Measurement(_measure.memory, ("mem_pss", "mem_uss")),
    "failure": Measurement(_measure.failure, ("fail_time", "fail_shows_error", "fail_left")),
    "interrupt": Measurement(
        functools.partial(_measure.interrupt, whole_group=False), ("interrupt_caller",)
    ),
    "interrupt-group": Measurement(
        functools.partial(_measure.interrupt, whole_group=True), ("interrupt_group",)
    ),
}


def run_suite(
    tools: Sequence[Tool], plan: dict[str, int], options: Options, console: TextIO
) -> Results:
    """Run ``plan`` (measurement -> repetitions); each repetition runs every tool once, in an
    order rotated per repetition."""
    results: Results = {}
    missing = {tool.name: tool.unavailable() for tool in tools}
    for tool in tools:
        if missing[tool.name] is None:
            tool.load()  # the import cell, never timed
    for name, repetitions in plan.items():
        measurement = MEASUREMENTS[name]
        for metric in measurement.metrics:
            results.setdefault(metric, {})
        for tool in tools:
            if (reason := missing[tool.name]) is not None:
                _mark_na(results, measurement, tool.name, reason)
            elif measurement.warm_up:
                _run_once({}, measurement, tool, options, None)
        for repetition in range(repetitions):
            console.write(f"{name} {repetition + 1}/{repetitions}:")
            reference = _reference(results, options) if name == "train" else None
            for tool in rotated(list(tools), repetition):
                if results[measurement.metrics[0]].setdefault(tool.name, Cell()).na is None:
                    _run_once(results, measurement, tool, options, reference)
                    console.write(f" {tool.name}")
                    console.flush()
            console.write("\n")
    return results


def _reference(results: Results, options: Options) -> float:
    """The single-process training run of this repetition; returns its samples/s."""
    outcome = _measure.single_process(options)
    _record(results, SINGLE_PROCESS, outcome)
    return outcome.values["samples_per_s"]


def _run_once(
    results: Results,
    measurement: Measurement,
    tool: Tool,
    options: Options,
    reference: float | None,
) -> None:
    try:
        outcome = measurement.run(tool, options)
    except NotApplicable as reason:
        _mark_na(results, measurement, tool.name, str(reason))
        return
    except Exception as error:  # one tool failing must not end the comparison
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        _mark_na(results, measurement, tool.name, f"failed: {type(error).__name__} {message}")
        return
    finally:
        reap_children()
    if reference is not None:
        outcome.values["core_scaling"] = outcome.values["samples_per_s"] / reference
    _record(results, tool.name, outcome)


def _record(results: Results, tool_name: str, outcome: Outcome) -> None:
    for metric, value in outcome.values.items():
        results.setdefault(metric, {}).setdefault(tool_name, Cell()).values.append(value)
    for metric, note in outcome.notes.items():
        cell = results.setdefault(metric, {}).setdefault(tool_name, Cell())
        if note not in cell.notes:
            cell.notes.append(note)


def _mark_na(results: Results, measurement: Measurement, tool_name: str, reason: str) -> None:
    for metric in measurement.metrics:
        cell = results.setdefault(metric, {}).setdefault(tool_name, Cell())
        cell.na = reason[:200]
