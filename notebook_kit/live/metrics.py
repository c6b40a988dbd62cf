"""Kernel side of the metrics channel, run in the kernel: every logged value, bounded memory.

Workers send batches through :mod:`notebook_kit.runtime.metrics`; the plot, the headless view
and the run record read the means over ranks per step from here. Each metric keeps at most
``MAX_POINTS`` points, merging neighbouring steps in pairs beyond that (the newest step stays a
point of its own), while the count, sum, minimum, maximum and last value of every point and rank
stay exact: ``docs/live_view.md`` says what that keeps. A value a rank logs twice for the same
step counts twice (the point shows their mean).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from notebook_kit.runtime.messages import MetricsBatch

__all__ = ["MAX_POINTS", "MetricStats", "MetricsAggregator"]

MAX_POINTS = 2048  # per metric; ≈ 0.1 MB per metric and rank, whatever the number of log calls
# Per point, per rank, six doubles at offset 6 * rank: how many values, their sum, the sum of
# their steps, their minimum, maximum and the last one. A count of 0 means "not logged".
_COUNT, _SUM, _STEP_SUM, _MIN, _MAX, _LAST = range(6)
_FIELDS = 6


@dataclass(frozen=True)
class MetricStats:
    """Exact facts about one metric, however many points were merged.

    Attributes:
        count: Values logged (all ranks together, or one rank's).
        min: The smallest value logged.
        max: The largest value logged.
        last: The mean over ranks at the newest step (for one rank: its newest value).
        first_step: The smallest step logged.
        last_step: The largest step logged.
        steps_per_point: Consecutive steps each point of the history stands for (1: exact).

    Example::

        metrics.stats("loss").min
        # 0.0123
    """

    count: int
    min: float
    max: float
    last: float
    first_step: int
    last_step: int
    steps_per_point: int


class _Series:
    """One metric: points keyed by ``step // width``, each a flat list of per-rank aggregates.

    The newest step is held apart, in ``pending``, until a later step arrives: whatever was
    merged before it, the last point of a history is the newest step exactly as logged, which
    is what users read as the final value. ``points`` holds at most ``MAX_POINTS - 1`` points,
    so a history, ``pending`` included, has at most ``MAX_POINTS``.

    A list of floats rather than an ``array``: ``add`` runs for every record, and list items
    are read without boxing a new float each time.
    """

    __slots__ = ("first_step", "newest", "newest_step", "pending", "points", "width")

    def __init__(self) -> None:
        self.width = 1
        self.points: dict[int, list[float]] = {}
        self.pending: list[float] = []  # the aggregates of newest_step, not yet in points
        self.newest_step: int | None = None
        self.newest: dict[int, float] = {}  # rank -> value at newest_step
        self.first_step: int | None = None

    def add(self, rank: int, step: int, value: float) -> None:
        # The kernel runs this for every record of every rank: kept to plain indexing.
        newest = self.newest_step
        if newest is None or step > newest:
            if self.pending:
                self._settle_pending()
            self.newest_step, self.newest = step, {rank: value}
            if self.first_step is None:
                self.first_step = step
        elif step == newest:
            self.newest[rank] = value
        else:
            if step < self.first_step:  # type: ignore[operator]  # set with newest_step
                self.first_step = step
            at = _FIELDS * rank
            point = self.points.get(step // self.width)
            if point is None or len(point) <= at:
                point = self._point_for(step // self.width, rank)
            _add_value(point, at, step, value)
            return
        at = _FIELDS * rank
        if len(self.pending) <= at:
            self.pending.extend([0.0] * (at + _FIELDS - len(self.pending)))
        _add_value(self.pending, at, step, value)

    def _settle_pending(self) -> None:
        """A later step arrived: the newest step's aggregates join the merged points."""
        step = int(self.newest_step)  # type: ignore[arg-type]  # pending implies a step
        pending, self.pending = self.pending, []
        point = self._point_for(step // self.width, len(pending) // _FIELDS - 1)
        _merge_into(point, pending)

    def _point_for(self, key: int, rank: int) -> list[float]:
        """The point ``key``, created or widened to hold ``rank`` (resolution halved if full)."""
        point = self.points.get(key)
        size = _FIELDS * (rank + 1)
        if point is None:
            point = self.points[key] = [0.0] * size
            if len(self.points) >= MAX_POINTS:  # one place stays free for pending
                self._halve_resolution()
                return self._point_for(key // 2, rank)
        elif len(point) < size:
            point.extend([0.0] * (size - len(point)))
        return point

    def _halve_resolution(self) -> None:
        """Merge neighbouring points in pairs: keys ``2k`` and ``2k + 1`` become ``k``."""
        self.width *= 2
        merged: dict[int, list[float]] = {}
        for key in sorted(self.points):
            point = self.points[key]
            into = merged.get(key // 2)
            if into is None:
                merged[key // 2] = point
            else:
                _merge_into(into, point)
        self.points = merged

    def drop_from(self, step: int) -> bool:
        """Forget the values at ``step`` and later (a restarted run logs them again); False
        once nothing is left. A point merging steps on both sides of ``step`` is kept."""
        if self.newest_step is None or self.newest_step < step:
            return True
        self.pending, self.newest = [], {}
        self.points = {key: p for key, p in self.points.items() if key * self.width < step}
        if not self.points:
            self.newest_step = self.first_step = None
            return False
        last = self.points.pop(max(self.points))  # held apart again, as the newest step
        ranks = list(_ranks_in(last))
        count = sum(last[_FIELDS * r + _COUNT] for r in ranks)
        self.newest_step = round(sum(last[_FIELDS * r + _STEP_SUM] for r in ranks) / count)
        self.newest = {r: last[_FIELDS * r + _LAST] for r in ranks}
        self.pending = last
        return True

    def all_points(self) -> list[list[float]]:
        """Every point in step order, the newest step's last."""
        points = [self.points[key] for key in sorted(self.points)]
        return [*points, self.pending] if self.pending else points

    def ranks(self) -> set[int]:
        return {rank for point in self.all_points() for rank in _ranks_in(point)}

    def rows(self, rank: int | None = None) -> Iterator[tuple[int, float, float, float]]:
        """``(step, mean, min, max)`` per point in step order, over all ranks or one."""
        for point in self.all_points():
            ranks = list(_ranks_in(point)) if rank is None else [rank]
            offsets = [_FIELDS * r for r in ranks if _FIELDS * r < len(point)]
            offsets = [at for at in offsets if point[at + _COUNT] > 0]
            if not offsets:
                continue
            count = sum(point[at + _COUNT] for at in offsets)
            step = round(sum(point[at + _STEP_SUM] for at in offsets) / count)
            mean = sum(point[at + _SUM] / point[at + _COUNT] for at in offsets) / len(offsets)
            low = min(point[at + _MIN] for at in offsets)
            high = max(point[at + _MAX] for at in offsets)
            yield step, mean, low, high


def _add_value(point: list[float], at: int, step: int, value: float) -> None:
    """Count one value of one rank (its aggregates start at ``at``) into ``point``."""
    if point[at]:  # _COUNT
        if value < point[at + _MIN]:
            point[at + _MIN] = value
        elif value > point[at + _MAX]:
            point[at + _MAX] = value
    else:
        point[at + _MIN] = point[at + _MAX] = value
    point[at] += 1
    point[at + _SUM] += value
    point[at + _STEP_SUM] += step
    point[at + _LAST] = value


def _ranks_in(point: list[float]) -> Iterator[int]:
    for rank in range(len(point) // _FIELDS):
        if point[_FIELDS * rank + _COUNT] > 0:
            yield rank


def _merge_into(into: list[float], later: list[float]) -> None:
    """Add ``later``'s aggregates (of later steps) to ``into``'s, rank by rank."""
    if len(into) < len(later):
        into.extend([0.0] * (len(later) - len(into)))
    for at in range(0, len(later), _FIELDS):
        if later[at + _COUNT] == 0:
            continue
        if into[at + _COUNT] == 0:
            into[at : at + _FIELDS] = later[at : at + _FIELDS]
            continue
        into[at + _COUNT] += later[at + _COUNT]
        into[at + _SUM] += later[at + _SUM]
        into[at + _STEP_SUM] += later[at + _STEP_SUM]
        into[at + _MIN] = min(into[at + _MIN], later[at + _MIN])
        into[at + _MAX] = max(into[at + _MAX], later[at + _MAX])
        into[at + _LAST] = later[at + _LAST]


@dataclass
class MetricsAggregator:
    """Every logged value by metric, step and rank, in bounded memory; means over ranks.

    Example:
        >>> metrics = MetricsAggregator()
        >>> metrics.add(0, 1, {"loss": 1.0}); metrics.add(1, 1, {"loss": 3.0})
        >>> metrics.history("loss")
        [(1, 2.0)]
    """

    values: dict[str, _Series] = field(default_factory=dict)  # by metric; truthy once logged
    dropped: dict[int, int] = field(default_factory=dict)  # rank -> records it could not send
    version: int = 0  # grows with every change; a display redraws when it moved
    _auto_steps: dict[int, int] = field(default_factory=dict)

    def add(self, rank: int, step: int | None, values: Mapping[str, float]) -> None:
        """Record one ``log`` call of ``rank``; ``step=None`` counts that rank's calls."""
        self._add_records([(rank, step, values)])

    def _add_records(self, records: Iterable[tuple[int, int | None, Mapping[str, float]]]) -> None:
        # One loop for a whole batch: the kernel runs it for every record of every rank.
        auto_steps, every_series, added = self._auto_steps, self.values, 0
        for rank, given_step, values in records:
            step = auto_steps.get(rank, 0) if given_step is None else int(given_step)
            auto_steps[rank] = step + 1
            for name, value in values.items():
                series = every_series.get(name)
                if series is None:
                    series = every_series[name] = _Series()
                series.add(rank, step, float(value))
            added += 1
        self.version += added

    def drop_from(self, step: int) -> None:
        """Forget every value logged at ``step`` and later: a run restarted from a checkpoint
        logs those steps again, and they replace the old ones instead of adding to them.

        Example:
            >>> metrics = MetricsAggregator()
            >>> for step in range(4): metrics.add(0, step, {"loss": float(step)})
            >>> metrics.drop_from(2); metrics.add(0, 2, {"loss": 9.0})
            >>> metrics.history("loss")
            [(0, 0.0), (1, 1.0), (2, 9.0)]
        """
        for name in [name for name, series in self.values.items() if not series.drop_from(step)]:
            del self.values[name]
        self.version += 1

    def add_batch(self, batch: MetricsBatch) -> None:
        """Take a rank's batch: its records, and its count of dropped ones when it has one."""
        self._add_records(batch.records)
        if batch.dropped is not None and batch.dropped != self.dropped.get(batch.rank, 0):
            self.dropped[batch.rank] = batch.dropped
            self.version += 1

    @property
    def total_dropped(self) -> int:
        """Records the workers could not send (the kernel read too slowly)."""
        return sum(self.dropped.values())

    def history(self, name: str) -> list[tuple[int, float]]:
        """``(step, mean over the ranks that logged it)`` for one metric, by step.

        At most :data:`MAX_POINTS` points; see the module docstring for merged points.
        """
        series = self.values.get(name)
        return [(step, mean) for step, mean, _, _ in series.rows()] if series else []

    def rank_history(self, name: str, rank: int) -> list[tuple[int, float]]:
        """``(step, value)`` that ``rank`` logged for one metric (means of merged steps)."""
        series = self.values.get(name)
        return [(step, mean) for step, mean, _, _ in series.rows(rank)] if series else []

    def envelope(self, name: str) -> list[tuple[int, float, float]]:
        """``(step, min, max)`` over ranks and merged steps, for each point of ``history``.

        Example::

            steps, lows, highs = zip(*metrics.envelope("loss"))
        """
        series = self.values.get(name)
        return [(step, low, high) for step, _, low, high in series.rows()] if series else []

    def stats(self, name: str, rank: int | None = None) -> MetricStats:
        """Exact count, min, max, last value and step range of one metric (or one rank's).

        Raises:
            KeyError: ``name`` was never logged (by ``rank``).

        Example::

            metrics.stats("loss").count
            # 200000
        """
        series = self.values[name]
        points = series.all_points()
        offsets = [
            (point, _FIELDS * r)
            for point in points
            for r in (_ranks_in(point) if rank is None else [rank])
            if _FIELDS * r < len(point) and point[_FIELDS * r + _COUNT] > 0
        ]
        if not offsets:
            raise KeyError(f"rank {rank} never logged {name!r}")
        newest = series.newest if rank is None else {rank: _last_of(series, rank)}
        return MetricStats(
            count=int(sum(point[at + _COUNT] for point, at in offsets)),
            min=min(point[at + _MIN] for point, at in offsets),
            max=max(point[at + _MAX] for point, at in offsets),
            last=sum(newest.values()) / len(newest),
            first_step=int(series.first_step or 0),
            last_step=int(series.newest_step or 0),
            steps_per_point=series.width,
        )

    def latest(self) -> dict[str, float]:
        """The mean at the last step of every metric."""
        return {
            name: sum(series.newest.values()) / len(series.newest)
            for name, series in self.values.items()
        }

    def histories(self) -> dict[str, list[tuple[int, float]]]:
        """:meth:`history` of every metric."""
        return {name: self.history(name) for name in self.values}

    def rank_histories(self) -> dict[int, dict[str, list[tuple[int, float]]]]:
        """Per rank, :meth:`rank_history` of every metric it logged."""
        ranks = sorted({rank for series in self.values.values() for rank in series.ranks()})
        return {
            rank: {
                name: history for name in self.values if (history := self.rank_history(name, rank))
            }
            for rank in ranks
        }


def _last_of(series: _Series, rank: int) -> float:
    """``rank``'s newest value: in the newest point it appears in."""
    for point in reversed(series.all_points()):
        at = _FIELDS * rank
        if at < len(point) and point[at + _COUNT] > 0:
            return point[at + _LAST]
    raise KeyError(rank)
