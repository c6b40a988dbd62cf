"""Metric names as the displays show them: shortened when long, listed up to a cap.

A run may log thousands of metrics, or names ten kilobytes long. The summary line, the
progress lines, the plot's legend and its text fallback list a few, shortened in the middle
(``encoder.layer.0.attention…output.dense.weight``), and count the rest (``+4,990 more``), so
their size and the time to draw them do not grow with the number of metrics.
``last_run()`` keeps every name as logged: only the displays shorten.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

__all__ = ["joined", "listed", "more_text", "named_values", "short_name"]

SHORT_NAME = 40  # characters of a displayed name, the ellipsis included


def short_name(name: str, limit: int = SHORT_NAME) -> str:
    """``name`` if it fits in ``limit`` characters, else its start and end around ``…``.

    Example:
        >>> short_name("loss"), short_name("a" * 30 + "_middle_" + "z" * 30, 20)
        ('loss', 'aaaaaaaaaaa…zzzzzzzz')
    """
    if len(name) <= limit:
        return name
    tail = (limit - 1) // 2 - 1
    return f"{name[: limit - 1 - tail]}…{name[-tail:]}"


def more_text(hidden: int) -> str:
    """``"+4,990 more"``: the entry that stands for the names not listed.

    Example:
        >>> more_text(4990)
        '+4,990 more'
    """
    return f"+{hidden:,} more"


def listed(names: Iterable[str], limit: int) -> tuple[list[str], int]:
    """The first ``limit`` names (as given, not shortened) and how many others there are.

    Example:
        >>> listed(["a", "b", "c"], 2)
        (['a', 'b'], 1)
    """
    shown: list[str] = []
    hidden = 0
    for name in names:
        if len(shown) < limit:
            shown.append(name)
        else:
            hidden += 1
    return shown, hidden


def named_values(values: dict[str, float], limit: int, number: Callable[[float], str]) -> list[str]:
    """``"name value"`` for the first ``limit`` metrics, then ``"+N more"`` if there are more.

    Args:
        values: Metric name to value, in logging order.
        limit: How many to show.
        number: Formats a value.

    Example:
        >>> named_values({"loss": 0.5, "acc": 0.9, "lr": 0.1}, 2, "{:.2g}".format)
        ['loss 0.5', 'acc 0.9', '+1 more']
    """
    shown, hidden = listed(values, limit)
    parts = [f"{short_name(name)} {number(values[name])}" for name in shown]
    return [*parts, more_text(hidden)] if hidden else parts


def joined(names: Sequence[str], limit: int) -> str:
    """A comma-separated list of at most ``limit`` shortened names, then ``+N more``.

    Example:
        >>> joined(["loss", "acc", "lr"], 2)
        'loss, acc, +1 more'
    """
    shown, hidden = listed(names, limit)
    parts = [short_name(name) for name in shown]
    return ", ".join([*parts, more_text(hidden)] if hidden else parts)
