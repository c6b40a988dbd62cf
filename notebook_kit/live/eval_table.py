"""The table of evaluation rounds (one row per round, as in the Trainer's notebook view).

A row per step at which an evaluation metric was logged: that step, the epoch where one was
logged as a metric (the Trainer's), the training metrics averaged since the previous round,
and every evaluation metric (means over ranks).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from notebook_kit.live.panels import Panel
from notebook_kit.live.plot_layout import is_axis_name

__all__ = ["EvalTable", "EvalTablePanel", "build_table", "short_number"]

History = list[tuple[int, float]]
_TRAIN_COLUMNS = 3  # training metrics shown beside the evaluation ones
_PAD = ' style="padding:1px 10px"'
_LIVE_ROWS = 200  # newest rows shown while running; the saved table has them all
_NO_EVALUATION = "No evaluation metric yet (val_…, eval_…, or one logged less often)."


@dataclass(frozen=True)
class EvalTable:
    """Columns and rows of the table; ``rows`` hold None where a metric was not logged.

    Example:
        >>> table = build_table({"loss": [(0, 1.0), (1, 0.5)]}, {"val_loss": [(1, 0.7)]})
        >>> table.columns, table.rows
        (('step', 'loss (avg)', 'val_loss'), ((1, 0.75, 0.7),))
        >>> print(table.text())
        step  loss (avg)  val_loss
           1        0.75       0.7
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[float | int | None, ...], ...]

    def __bool__(self) -> bool:
        return bool(self.rows)

    def html(self, last: int | None = None) -> str:
        """An HTML table (the newest ``last`` rows, or all)."""
        rows = self.rows[-last:] if last else self.rows
        head = "".join(f"<th{_PAD}>{html.escape(column)}</th>" for column in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td{_PAD}>{_cell(value)}</td>" for value in row) + "</tr>"
            for row in rows
        )
        return (
            '<table class="nk-eval-table" style="border-collapse:collapse;font-size:12px;'
            f'text-align:right"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        )

    def text(self) -> str:
        """The table as aligned plain text."""
        cells = [list(self.columns)] + [[_cell(value) for value in row] for row in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        return "\n".join(
            "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
            for row in cells
        )


def build_table(
    train: dict[str, History], evals: dict[str, History], unit: str = "step"
) -> EvalTable:
    """One row per evaluation step; training metrics averaged since the previous row.

    A logged ``epoch`` is a column of its own: its newest value at the row's step.

    Example:
        >>> table = build_table({"epoch": [(9, 0.5), (19, 1.0)]}, {"eval_loss": [(19, 0.3)]})
        >>> table.columns, table.rows
        (('step', 'epoch', 'eval_loss'), ((19, 1.0, 0.3),))
    """
    steps = sorted({step for history in evals.values() for step, _ in history})
    by_step = {name: dict(history) for name, history in evals.items()}
    axes = [name for name in train if is_axis_name(name)]
    train_names = [name for name in train if name not in axes][:_TRAIN_COLUMNS]
    columns = (unit, *axes, *(f"{name} (avg)" for name in train_names), *evals)
    rows = []
    previous: int | None = None
    for step in steps:
        positions = [_value_at(train[name], step) for name in axes]
        averages = [_mean_between(train[name], previous, step) for name in train_names]
        row = (step, *positions, *averages, *(by_step[name].get(step) for name in evals))
        rows.append(row)
        previous = step
    return EvalTable(columns, tuple(rows))


def _value_at(history: History, step: int) -> float | None:
    """The newest value logged at or before ``step``."""
    earlier = [v for s, v in history if s <= step]
    return earlier[-1] if earlier else None


def _mean_between(history: History, after: int | None, upto: int) -> float | None:
    values = [v for s, v in history if (after is None or s > after) and s <= upto]
    return sum(values) / len(values) if values else None


def _cell(value: float | int | None) -> str:
    if value is None:
        return ""
    return str(value) if isinstance(value, int) else short_number(value)


def short_number(value: float) -> str:
    """Four significant digits; three in scientific notation when very large or small.

    Example:
        >>> short_number(0.004603), short_number(123456.0), short_number(float("nan"))
        ('0.004603', '1.235e+05', 'nan')
    """
    size = abs(value)
    if math.isfinite(value) and size and (size >= 1e5 or size < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4g}"


class EvalTablePanel(Panel):
    """The evaluation rounds: a tab from the first evaluation on, the whole table under the
    summary. Which metrics are evaluations, and the x unit, are ``run.plot``'s."""

    name = "evaluations"
    place = "tab"

    def __init__(self) -> None:
        self._key: list[str] = []  # the evaluations and their counts the HTML was made for
        self._html = ""

    def live_html(self) -> str:
        """The newest rows, scrolled inside a fixed height; remade only when they change."""
        evals = self.run.plot.evals if self.run.plot is not None else []
        if not evals:
            return ""
        key = [*evals, *(str(self.run.plot.feed.counts.get(name, 0)) for name in evals)]
        if key != self._key:
            table = self.table()
            waiting = f'<div style="color:#888;font-size:12px">{html.escape(_NO_EVALUATION)}</div>'
            self._key, self._html = key, table.html(last=_LIVE_ROWS) if table else waiting
        return self._html

    def table(self) -> EvalTable:
        """Every round so far (empty without a plot that found an evaluation metric)."""
        evals = self.run.plot.evals if self.run.plot is not None else []
        histories = self.run.metrics.histories()
        evaluation = {name: histories[name] for name in evals if name in histories}
        train = {name: h for name, h in histories.items() if name not in evaluation}
        return build_table(train, evaluation, self.run.plot.x_unit)

    def details(self) -> tuple[str, str] | None:
        table = self.table()
        if not table:
            return None
        head = "<details open><summary>evaluation rounds</summary>"
        return f"{head}{table.html()}</details>", f"evaluation rounds:\n{table.text()}"
