"""The new points of a run, as the browser plot needs them: means over ranks, by step.

The kernel never re-sends a history: every metrics message is folded into per-step sums, and
:meth:`PointFeed.take` hands over only the steps that changed since the last call. A step
whose mean changes later (the other rank's value arrived in a later batch) is sent again and
replaces the point in the browser. Only the most recent steps of each metric keep their sums,
so memory stays bounded however long the run; the final picture is drawn from the full record
(:class:`~notebook_kit.live.metrics.MetricsAggregator`), not from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from notebook_kit.runtime.messages import MetricsBatch

__all__ = ["PointFeed", "Points"]

Points = dict[str, tuple[list[float], list[float]]]  # name -> (steps, means)
_KEPT_STEPS = 1024  # per metric: the steps whose sums are kept for late-arriving ranks


class PointFeed:
    """Folds metrics messages into means per step; hands out what changed.

    Example:
        >>> feed = PointFeed()
        >>> feed.add_batch(MetricsBatch(0, ((0, 3, {"loss": 1.0}), (1, 3, {"loss": 3.0}))))
        >>> feed.take()
        {'loss': ([3], [2.0])}
    """

    def __init__(self, kept_steps: int = _KEPT_STEPS) -> None:
        self.kept_steps = kept_steps
        self.counts: dict[str, int] = {}  # distinct steps seen per metric
        self.last_step: int | None = None  # newest step rank 0 logged
        self._sums: dict[str, dict[int, list[float]]] = {}  # name -> step -> [sum, count]
        self._changed: dict[str, set[int]] = {}
        self._auto_steps: dict[int, int] = {}

    def add_batch(self, batch: MetricsBatch) -> None:
        for record_rank, step, values in batch.records:
            self._add(record_rank, step, values)

    def _add(self, rank: int, step: int | None, values: Mapping[str, float]) -> None:
        # Numbered like MetricsAggregator: step=None counts that rank's calls.
        step = self._auto_steps.get(rank, 0) if step is None else int(step)
        self._auto_steps[rank] = step + 1
        if rank == 0:
            self.last_step = step if self.last_step is None else max(self.last_step, step)
        for name, value in values.items():
            by_step = self._sums.setdefault(name, {})
            entry = by_step.get(step)
            if entry is None:
                by_step[step] = [value, 1.0]
                self.counts[name] = self.counts.get(name, 0) + 1
                if len(by_step) > 2 * self.kept_steps:
                    self._forget_oldest(by_step)
            else:
                entry[0] += value
                entry[1] += 1
            self._changed.setdefault(name, set()).add(step)

    def _forget_oldest(self, by_step: dict[int, list[float]]) -> None:
        for step in sorted(by_step)[: len(by_step) - self.kept_steps]:
            del by_step[step]

    def drop_from(self, step: int) -> None:
        """Forget the steps from ``step`` on (a restarted run logs them again)."""
        for name, by_step in self._sums.items():
            gone = [s for s in by_step if s >= step]
            for s in gone:
                del by_step[s]
            self.counts[name] = max(self.counts.get(name, 0) - len(gone), 0)
            self._changed.get(name, set()).difference_update(gone)
        if self.last_step is not None and self.last_step >= step:
            self.last_step = step - 1 if step > 0 else None

    def take(self) -> Points:
        """The points changed since the last call, by metric, in step order."""
        points: Points = {}
        for name, steps in self._changed.items():
            by_step = self._sums[name]
            kept = sorted(step for step in steps if step in by_step)
            if kept:
                points[name] = (kept, [by_step[s][0] / by_step[s][1] for s in kept])
        self._changed.clear()
        return points

    @property
    def names(self) -> Iterable[str]:
        """Every metric seen, in the order it first appeared."""
        return self._sums.keys()
