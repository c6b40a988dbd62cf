"""How logged metrics are laid out, shared by the live plot in the browser and the final PNG.

Pure decisions, no drawing: which metrics share a panel, which are evaluation metrics (drawn
as markers, listed in the table), whether the user logged by step or by epoch, EMA smoothing
and axis limits that stay readable for a single point or a flat line.

An ``epoch`` that is logged as a metric (the Trainer logs one with every record) counts where
the run is along the x axis: it is a column of the evaluation table, never a plotted line
that only rises and squashes its neighbours. However many metrics a run logs, a panel draws
at most ``LINES_PER_PANEL`` of them and counts the rest of its family (``+4,990 more``), so
drawing stays quick and the legend readable.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "X_AXES",
    "PlotPanel",
    "XAxis",
    "XUnit",
    "axis_limits",
    "axis_metric",
    "check_x_axis",
    "ema",
    "epoch_positions",
    "eval_metrics",
    "infer_x_unit",
    "is_axis_name",
    "is_eval_name",
    "metric_group",
    "plan_panels",
    "thinned",
    "use_log",
]

XUnit = Literal["step", "epoch"]
X_AXES = ("step", "epoch")  # the x-axis choices: the logged step, or the logged epoch
XAxis = Literal["step", "epoch"]


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


YScale = Literal["auto", "linear", "log"]
_AUTO_LOG_SPAN = 1000.0

_SPLIT_PREFIX = re.compile(r"^(train|training|val|valid|validation|eval|test)[_/.\-]", re.I)
_EVAL_PREFIX = re.compile(r"^(val|valid|validation|eval|test)([_/.\-]|$)", re.I)
_PER_GROUP_PANELS = 4  # up to this many groups get a panel each; more are merged by family
LINES_PER_PANEL = 10  # drawn, and in the legend; the rest of the panel's family is counted
_AXIS_GROUPS = frozenset({"epoch"})  # logged positions along the run: x-axis candidates
_FLAT_SPAN = 1e-9  # a spread this small against the values' size is rounding: a flat line
# Families, checked in order: the first whose pattern matches a group's name takes it.
_FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("learning rate", re.compile(r"(^|[_/.])(lr|learning_rate)($|[_/.])", re.I)),
    ("loss", re.compile(r"loss|err|mse|mae|rmse|nll|perplexity|ppl", re.I)),
    ("accuracy", re.compile(r"acc|f1|precision|recall|auc|score|iou|dice|bleu|rouge|map", re.I)),
)
_SPARSE_SHARE = 0.2  # fewer points than this share of the densest metric's: an evaluation metric
_SPARSE_MIN_DENSEST = 10  # ... once the densest has at least this many


@dataclass(frozen=True)
class PlotPanel:
    """One box of the plot: its y-axis label, the metrics drawn in it (in logging order) and how
    many more of its family are left out of the drawing."""

    label: str
    names: tuple[str, ...]
    more: int = 0


def metric_group(name: str) -> str:
    """``"val_loss"`` and ``"train/loss"`` both belong to ``"loss"``.

    Example:
        >>> metric_group("val_loss"), metric_group("train/acc"), metric_group("lr")
        ('loss', 'acc', 'lr')
    """
    return _SPLIT_PREFIX.sub("", name) or name


def is_axis_name(name: str) -> bool:
    """A position along the run logged as a metric (``epoch``): not drawn as a line.

    Example:
        >>> is_axis_name("epoch"), is_axis_name("train/epoch"), is_axis_name("epoch_loss")
        (True, True, False)
    """
    return metric_group(name).lower() in _AXIS_GROUPS


def axis_metric(names: Iterable[str]) -> str | None:
    """The first logged position along the run (``epoch``), which the x axis can show.

    Example:
        >>> axis_metric(["loss", "train/epoch", "epoch"]), axis_metric(["loss"])
        ('train/epoch', None)
    """
    return next((name for name in names if is_axis_name(name)), None)


def epoch_positions(steps: Sequence[float], epochs: Sequence[tuple[float, float]]) -> list[float]:
    """Where ``steps`` fall along the logged epoch: ``epochs`` is its ``(step, epoch)``
    history in step order; between two logged steps the epoch is interpolated, before the
    first and after the last it is theirs. The browser plot does the same.

    Example:
        >>> epoch_positions([0, 5, 10, 20], [(0, 0.0), (10, 1.0)])
        [0.0, 0.5, 1.0, 1.0]
    """
    if not epochs:
        return [float(step) for step in steps]
    at = [step for step, _ in epochs]
    positions = []
    for step in steps:
        i = bisect.bisect_left(at, step)
        if i >= len(at):
            positions.append(float(epochs[-1][1]))
        elif at[i] == step or i == 0:
            positions.append(float(epochs[i][1]))
        else:
            (s0, e0), (s1, e1) = epochs[i - 1], epochs[i]
            positions.append(float(e0 + (e1 - e0) * (step - s0) / (s1 - s0)))
    return positions


def is_eval_name(name: str) -> bool:
    """Named like an evaluation metric (``val_loss``, ``eval/acc``, ``test_f1``).

    Example:
        >>> is_eval_name("val_loss"), is_eval_name("loss"), is_eval_name("validity")
        (True, False, False)
    """
    return bool(_EVAL_PREFIX.match(name))


def eval_metrics(counts: dict[str, int]) -> list[str]:
    """The metrics to show as evaluation rounds: named so, or logged much less often.

    Args:
        counts: Points logged so far per metric.

    Example:
        >>> eval_metrics({"loss": 100, "val_loss": 4, "acc": 4, "lr": 100})
        ['val_loss', 'acc']
    """
    counts = {name: n for name, n in counts.items() if not is_axis_name(name)}
    densest = max(counts.values(), default=0)
    sparse_limit = _SPARSE_SHARE * densest if densest >= _SPARSE_MIN_DENSEST else -1
    return [name for name, n in counts.items() if is_eval_name(name) or n < sparse_limit]


def _family(group: str) -> str:
    for family, pattern in _FAMILIES:
        if pattern.search(group):
            return family
    return "other"


def plan_panels(names: Iterable[str]) -> list[PlotPanel]:
    """One panel per metric group while there are few, else one per family; ``epoch`` and
    the like in none. A panel draws its first ``LINES_PER_PANEL`` metrics.

    Example:
        >>> [p.label for p in plan_panels(["loss", "val_loss", "acc"])]
        ['loss', 'acc']
        >>> [p.names for p in plan_panels(["a_loss", "b_loss", "c_loss", "acc", "f1"])]
        [('a_loss', 'b_loss', 'c_loss'), ('acc', 'f1')]
    """
    groups: dict[str, list[str]] = {}
    for name in names:
        if not is_axis_name(name):
            groups.setdefault(metric_group(name), []).append(name)
    if len(groups) > _PER_GROUP_PANELS:
        families: dict[str, list[str]] = {}
        for group, members in groups.items():
            families.setdefault(_family(group), []).extend(members)
        groups = families
    return [
        PlotPanel(label, tuple(members[:LINES_PER_PANEL]), max(0, len(members) - LINES_PER_PANEL))
        for label, members in groups.items()
    ]


def infer_x_unit(last_logged_step: int | None, steps_done: int, epoch_length: int | None) -> XUnit:
    """Whether the logged ``step`` values count epochs or training steps.

    The kernel knows both what rank 0 logged and how many batches it trained: a logged step
    that stays near the number of epochs begun while the batch count runs far ahead is an
    epoch index (``accelerator.log(..., step=epoch)``).

    Example:
        >>> infer_x_unit(3, 92, 23), infer_x_unit(91, 92, 23), infer_x_unit(0, 0, None)
        ('epoch', 'step', 'step')
    """
    if last_logged_step is None or not epoch_length or steps_done < epoch_length:
        return "step"
    epochs_begun = math.ceil(steps_done / epoch_length)
    logged = last_logged_step + 1
    return "epoch" if logged <= epochs_begun + 1 and 2 * logged < steps_done else "step"


def ema(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's debiased exponential moving average (``weight`` 0: the values unchanged).

    Example:
        >>> [round(v, 3) for v in ema([1.0, 0.0, 0.0], 0.5)]
        [1.0, 0.333, 0.143]
    """
    if weight <= 0:
        return list(values)
    smoothed, last, count = [], 0.0, 0
    for value in values:
        if not math.isfinite(value):
            smoothed.append(value)
            continue
        count += 1
        last = last * weight + (1 - weight) * value
        smoothed.append(last / (1 - weight**count))
    return smoothed


def axis_limits(values: Iterable[float], log: bool = False) -> tuple[float, float] | None:
    """Limits that frame ``values`` with a margin, also for one point or a flat line.

    A single value, or values equal but for rounding, get ±10% of themselves (not
    matplotlib's ±0.04 around 0.0046, nor a range of 1e-20 that draws rounding noise as a
    zigzag); a log axis ignores values that are not positive. None when nothing can be drawn.

    Example:
        >>> axis_limits([0.0046])
        (0.00414, 0.00506)
        >>> axis_limits([0.0, 1.0])
        (-0.05, 1.05)
        >>> axis_limits([5e-05, 5.000000000000001e-05])
        (4.5e-05, 5.5e-05)
    """
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return None
    low, high = min(finite), max(finite)
    if high - low <= _FLAT_SPAN * max(abs(low), abs(high)):
        low = high  # a constant learning rate that rounding made wobble: flat, not noise
    if log:
        low, high = math.log10(low), math.log10(high)
    if high == low:
        pad = abs(low) * 0.1 if low else 1.0
        pad = 0.5 if log else pad
    else:
        pad = (high - low) * 0.05
    low, high = low - pad, high + pad
    if log:
        return 10**low, 10**high
    return round(low, 12), round(high, 12)


def use_log(values: Iterable[float], scale: YScale) -> bool:
    """Whether a panel's y axis is logarithmic: asked for, or ``"auto"`` and the values are
    all positive and span more than a thousandfold (a falling loss stays readable).

    Example:
        >>> use_log([150.0, 1e-7], "auto"), use_log([0.0, 1.0], "auto"), use_log([1.0], "log")
        (True, False, True)
    """
    if scale != "auto":
        return scale == "log"
    finite = [v for v in values if math.isfinite(v)]
    if not finite or min(finite) <= 0:
        return False
    return max(finite) > _AUTO_LOG_SPAN * min(finite)


def thinned(history: Sequence[tuple[int, float]], most: int) -> tuple[list[float], list[float]]:
    """Steps and values of every ``len(history) // most``-th point, and always the newest.

    Example:
        >>> thinned([(0, 1.0), (1, 0.5), (2, 0.25)], 1)
        ([0, 2], [1.0, 0.25])
    """
    points = list(history[:: max(1, len(history) // most)])
    if points and points[-1] != history[-1]:
        points.append(history[-1])
    return [step for step, _ in points], [value for _, value in points]
