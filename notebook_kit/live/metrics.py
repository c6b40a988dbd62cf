"""The kernel half of the metrics channel: every logged value by metric, step and rank.

Workers send batches through :mod:`notebook_kit.runtime.metrics`; the plot, the headless view
and the run record read the means over ranks per step from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from notebook_kit.runtime.metrics import BATCH_KIND, SINGLE_KIND, plain_values

__all__ = ["MetricsAggregator"]


@dataclass
class MetricsAggregator:
    """Every logged value by metric, step and rank; means over ranks per step.

    Example:
        >>> metrics = MetricsAggregator()
        >>> metrics.add(0, 1, {"loss": 1.0}); metrics.add(1, 1, {"loss": 3.0})
        >>> metrics.history("loss")
        [(1, 2.0)]
    """

    values: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)
    dropped: dict[int, int] = field(default_factory=dict)  # rank -> records it could not send
    version: int = 0  # grows with every change; a display redraws when it moved
    _auto_steps: dict[int, int] = field(default_factory=dict)

    def add(self, rank: int, step: int | None, values: Mapping[str, float]) -> None:
        """Record one ``log`` call of ``rank``; ``step=None`` counts that rank's calls."""
        if step is None:
            step = self._auto_steps.get(rank, 0)
        self._auto_steps[rank] = int(step) + 1
        for name, value in values.items():
            self.values.setdefault(name, {}).setdefault(int(step), {})[rank] = float(value)
        self.version += 1

    def add_message(self, rank: int, kind: str, payload: Any) -> bool:
        """Take a worker message if it carries metrics; False for other kinds."""
        if kind == SINGLE_KIND:
            values = plain_values(dict(payload.get("values", {})))
            self.add(int(payload.get("rank", rank)), payload.get("step"), values)
            return True
        if kind != BATCH_KIND:
            return False
        for record_rank, step, values in payload["records"]:
            self.add(record_rank, step, values)
        if payload.get("dropped", 0) != self.dropped.get(rank, 0):
            self.dropped[rank] = payload["dropped"]
            self.version += 1
        return True

    @property
    def total_dropped(self) -> int:
        return sum(self.dropped.values())

    def history(self, name: str) -> list[tuple[int, float]]:
        """``(step, mean over the ranks that logged it)`` for one metric, by step."""
        by_step = self.values.get(name, {})
        return [(step, sum(r.values()) / len(r)) for step, r in sorted(by_step.items())]

    def rank_history(self, name: str, rank: int) -> list[tuple[int, float]]:
        """``(step, value)`` that ``rank`` logged for one metric."""
        by_step = self.values.get(name, {})
        return [(step, r[rank]) for step, r in sorted(by_step.items()) if rank in r]

    def latest(self) -> dict[str, float]:
        """The mean at the last step of every metric."""
        latest = {}
        for name, by_step in self.values.items():
            ranks = by_step[max(by_step)]
            latest[name] = sum(ranks.values()) / len(ranks)
        return latest

    def histories(self) -> dict[str, list[tuple[int, float]]]:
        return {name: self.history(name) for name in self.values}

    def rank_histories(self) -> dict[int, dict[str, list[tuple[int, float]]]]:
        ranks = sorted({rank for s in self.values.values() for r in s.values() for rank in r})
        return {
            rank: {
                name: history for name in self.values if (history := self.rank_history(name, rank))
            }
            for rank in ranks
        }
