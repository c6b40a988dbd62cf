"""How logged metrics are laid out, shared by the live plot in the browser and the final PNG.

Pure decisions, no drawing: which metrics share a panel, which are evaluation metrics (drawn
as markers, listed in the table), whether the user logged by step or by epoch, EMA smoothing
and axis limits that stay readable for a single point.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Panel",
    "XUnit",
    "axis_limits",
    "ema",
    "eval_metrics",
    "infer_x_unit",
    "is_eval_name",
    "metric_group",
    "plan_panels",
    "use_log",
]

XUnit = Literal["step", "epoch"]
YScale = Literal["auto", "linear", "log"]
_AUTO_LOG_SPAN = 1000.0

_SPLIT_PREFIX = re.compile(r"^(train|training|val|valid|validation|eval|test)[_/.\-]", re.I)
_EVAL_PREFIX = re.compile(r"^(val|valid|validation|eval|test)([_/.\-]|$)", re.I)
_PER_GROUP_PANELS = 4  # up to this many groups get a panel each; more are merged by family
# Families, checked in order: the first whose pattern matches a group's name takes it.
_FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("learning rate", re.compile(r"(^|[_/.])(lr|learning_rate)($|[_/.])", re.I)),
    ("loss", re.compile(r"loss|err|mse|mae|rmse|nll|perplexity|ppl", re.I)),
    ("accuracy", re.compile(r"acc|f1|precision|recall|auc|score|iou|dice|bleu|rouge|map", re.I)),
)
_SPARSE_SHARE = 0.2  # fewer points than this share of the densest metric's: an evaluation metric
_SPARSE_MIN_DENSEST = 10  # ... once the densest has at least this many


@dataclass(frozen=True)
class Panel:
    """One plot panel: its y-axis label and the metrics drawn in it, in logging order."""

    label: str
    names: tuple[str, ...]


def metric_group(name: str) -> str:
    """``"val_loss"`` and ``"train/loss"`` both belong to ``"loss"``.

    Example:
        >>> metric_group("val_loss"), metric_group("train/acc"), metric_group("lr")
        ('loss', 'acc', 'lr')
    """
    return _SPLIT_PREFIX.sub("", name) or name


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
    densest = max(counts.values(), default=0)
    sparse_limit = _SPARSE_SHARE * densest if densest >= _SPARSE_MIN_DENSEST else -1
    return [name for name, n in counts.items() if is_eval_name(name) or n < sparse_limit]


def _family(group: str) -> str:
    for family, pattern in _FAMILIES:
        if pattern.search(group):
            return family
    return "other"


def plan_panels(names: Iterable[str]) -> list[Panel]:
    """One panel per metric group while there are few, else one per family.

    Example:
        >>> [p.label for p in plan_panels(["loss", "val_loss", "acc"])]
        ['loss', 'acc']
        >>> [p.names for p in plan_panels(["a_loss", "b_loss", "c_loss", "acc", "f1"])]
        [('a_loss', 'b_loss', 'c_loss'), ('acc', 'f1')]
    """
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(metric_group(name), []).append(name)
    if len(groups) > _PER_GROUP_PANELS:
        families: dict[str, list[str]] = {}
        for group, members in groups.items():
            families.setdefault(_family(group), []).extend(members)
        groups = families
    return [Panel(label, tuple(members)) for label, members in groups.items()]


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

    A single value gets ±10% of itself (not matplotlib's ±0.04 around 0.0046); a log axis
    ignores values that are not positive. None when nothing can be drawn.

    Example:
        >>> axis_limits([0.0046])
        (0.00414, 0.00506)
        >>> axis_limits([0.0, 1.0])
        (-0.05, 1.05)
    """
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return None
    low, high = min(finite), max(finite)
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
