"""Kernel side of the speed figures: every rank's counts turned into rates, and their line.

Each rank's metrics batches carry its latest counts and memory peaks as a
:class:`~notebook_kit.runtime.messages.RankSpeed` (:mod:`notebook_kit.runtime.throughput`).
Here they become the run's figures (samples/s over all ranks, steps/s, tokens/s, where each
rank's steps go, the straggler, memory, MFU: ``docs/live_view.md`` defines each), shown under
the plot and kept in ``last_run().speed``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from notebook_kit.live.observer import LaunchInfo
from notebook_kit.live.panels import Panel
from notebook_kit.live.rank_groups import GROUPED_ABOVE, rank_spec
from notebook_kit.runtime.messages import MetricsBatch, RankSpeed, WorkerMessage

__all__ = [
    "STRAGGLER_MARGIN",
    "STRAGGLER_STEPS",
    "Speed",
    "SpeedPanel",
    "SpeedTracker",
    "speed_line",
]

STRAGGLER_MARGIN = 0.15  # busy time above the other ranks' median, as a fraction of it
STRAGGLER_STEPS = 10  # steps in the window a straggler must also lag in
_STRAGGLER_FLOOR = 1e-3  # seconds: below this, differences are timer noise
_SLOWEST = 3  # ranks (or nodes) named beside the median, with many


@dataclass(frozen=True)
class Speed:
    """How fast a run trained, from what its ranks counted.

    Attributes:
        samples: Samples counted, all ranks together.
        steps: Batches counted by the rank that counted most.
        tokens: Non-padding tokens, all ranks together; None when no batch carried tokens.
        seconds: The counting window: from a rank's first counted batch to the end of its
            function (or its latest count while running), the longest over ranks.
        samples_per_second: ``samples / seconds``; None (like every rate and the MFU) until
            each rank that counted a batch has timed a whole step.
        steps_per_second: ``steps / seconds``.
        tokens_per_second: ``tokens / seconds``, or None without tokens.
        ranks: Each rank's own counts and memory peaks, and where its steps go: ``data``,
            ``compute`` and ``wait`` in seconds per step, ``peak_memory_bytes``.
        mfu: Model FLOPs utilisation (0 to 1): the model's FLOPs per second over the peak of
            the GPUs at the run's precision; None on a CPU, an unknown GPU, or a model whose
            FLOPs are not known.
        straggler: The rank that holds the others back, or None.
        straggler_cause: ``"data"`` or ``"compute"``: where the straggler loses its time.

    Example::

        speed = last_run().speed
        speed.samples_per_second, speed.ranks[0].peak_memory_bytes
    """

    samples: int
    steps: int
    tokens: int | None
    seconds: float
    samples_per_second: float | None
    steps_per_second: float | None
    tokens_per_second: float | None
    ranks: dict[int, RankSpeed] = field(default_factory=dict)
    mfu: float | None = None
    straggler: int | None = None
    straggler_cause: str | None = None

    @property
    def peak_memory_bytes(self) -> dict[int, int | None]:
        """Each rank's peak resident memory (CPU), in bytes."""
        return {rank: speed.peak_memory_bytes for rank, speed in self.ranks.items()}


class SpeedTracker:
    """The latest counts of every rank, as their metrics batches bring them.

    Example::

        tracker = SpeedTracker(); tracker.take(batch.rank, batch.speed); tracker.speed()
    """

    def __init__(self) -> None:
        self.ranks: dict[int, RankSpeed] = {}
        self._window: dict[int, RankSpeed] = {}  # per rank: the start of its latest window
        self._last: dict[int, RankSpeed] = {}  # per rank: a count of the window in progress

    def take(self, rank: int, speed: RankSpeed | None) -> None:
        if speed is None:
            return
        self.ranks[rank] = speed
        # The window runs from a count at least STRAGGLER_STEPS steps back to the latest.
        last = self._last.get(rank)
        if last is None or speed.timed_steps < last.timed_steps:  # a new attempt: start over
            self._window[rank] = self._last[rank] = speed
        elif speed.timed_steps - last.timed_steps >= STRAGGLER_STEPS:
            self._window[rank], self._last[rank] = last, speed

    def speed(self) -> Speed | None:
        """The run's figures so far; None when no rank sent any."""
        if not self.ranks:
            return None
        ranks = dict(sorted(self.ranks.items()))
        samples = sum(speed.samples for speed in ranks.values())
        steps = max(speed.batches for speed in ranks.values())
        counted = [speed.tokens for speed in ranks.values() if speed.tokens is not None]
        tokens = sum(counted) if counted else None
        seconds = max(speed.seconds for speed in ranks.values())
        # A rate needs a timed step on every rank that counted: a resumed run that breaks out
        # at its first batch counted one batch over microseconds, which is no rate at all.
        timed = (
            seconds > 0 and steps > 0 and all(r.timed_steps for r in ranks.values() if r.batches)
        )
        straggler, cause = self._straggler(ranks)
        return Speed(
            samples=samples,
            steps=steps,
            tokens=tokens,
            seconds=seconds,
            samples_per_second=samples / seconds if timed else None,
            steps_per_second=steps / seconds if timed else None,
            tokens_per_second=tokens / seconds if timed and tokens is not None else None,
            ranks=ranks,
            mfu=_mfu(ranks, seconds) if timed else None,
            straggler=straggler,
            straggler_cause=cause,
        )

    def _straggler(self, ranks: dict[int, RankSpeed]) -> tuple[int | None, str | None]:
        """The rank lagging both over the whole run and over its latest window, and why."""
        whole = _lagging(ranks)
        if whole is None:
            return None, None
        windows = {rank: _since(self._window.get(rank), speed) for rank, speed in ranks.items()}
        recent = _lagging(windows)
        if recent is None or recent[0] != whole[0]:
            return None, None
        return whole


def _lagging(ranks: dict[int, RankSpeed]) -> tuple[int, str] | None:
    """The rank whose busy time per step exceeds the other ranks' median by the margin.

    Where the strategy does not report its collectives, a rank's wait hides in its compute
    and every rank's step looks the same: only a rank slower at reading data can be told.
    """
    if len(ranks) < 2 or any(speed.timed_steps < STRAGGLER_STEPS for speed in ranks.values()):
        return None
    if any(speed.wait is None for speed in ranks.values()):
        if any(speed.data is None for speed in ranks.values()):
            return None
        busy = {rank: speed.data or 0.0 for rank, speed in ranks.items()}
        slowest = max(busy, key=busy.__getitem__)
        typical = statistics.median(busy[rank] for rank in ranks if rank != slowest)
        step = statistics.median(speed.step or 0.0 for speed in ranks.values())
        lag = busy[slowest] - typical
        return (slowest, "data") if lag >= max(STRAGGLER_MARGIN * step, _STRAGGLER_FLOOR) else None
    busy = {rank: (speed.step or 0.0) - (speed.wait or 0.0) for rank, speed in ranks.items()}
    slowest = max(busy, key=busy.__getitem__)
    others = [rank for rank in ranks if rank != slowest]
    typical = statistics.median(busy[rank] for rank in others)
    if busy[slowest] - typical < max(STRAGGLER_MARGIN * typical, _STRAGGLER_FLOOR):
        return None
    data = (ranks[slowest].data or 0.0) - statistics.median(ranks[r].data or 0.0 for r in others)
    compute = (ranks[slowest].compute or 0.0) - statistics.median(
        ranks[r].compute or 0.0 for r in others
    )
    return slowest, "data" if data > compute else "compute"


def _since(start: RankSpeed | None, now: RankSpeed) -> RankSpeed:
    """What ``now`` counted since ``start``: the step-time sums of that window."""
    if start is None or start is now:
        return now

    def less(later: float | None, earlier: float | None) -> float | None:
        return None if later is None else later - (earlier or 0.0)

    return RankSpeed(
        timed_steps=now.timed_steps - start.timed_steps,
        step_seconds=now.step_seconds - start.step_seconds,
        data_seconds=less(now.data_seconds, start.data_seconds),
        wait_seconds=less(now.wait_seconds, start.wait_seconds),
    )


def _mfu(ranks: dict[int, RankSpeed], seconds: float) -> float | None:
    """Every rank's model FLOPs per second over the sum of their GPUs' peaks."""
    flops = [speed.flops for speed in ranks.values()]
    peaks = [speed.peak_flops for speed in ranks.values()]
    if seconds <= 0 or any(f is None for f in flops) or any(p is None for p in peaks):
        return None
    return sum(flops) / seconds / sum(peaks)  # type: ignore[arg-type]


def speed_line(speed: Speed | None, rank_nodes: dict[int, int] | None = None) -> str:
    """The speed figures as text: one line for the run, then one per node on a cluster.

    The run's line: samples/s, steps/s and tokens/s when counted; the step time split into
    data, compute and wait (the mean over ranks); the MFU where known; the straggler; the
    memory peaks. Empty when no rank sent any figure.

    Example:
        >>> ranks = {0: RankSpeed(64, 4, None, 2.0, 300 * 2**20)}
        >>> speed_line(Speed(64, 4, None, 2.0, 32.0, 2.0, None, ranks))
        'speed: 32.0 samples/s · 2.00 steps/s · peak memory 300 MiB CPU on the largest rank'
    """
    if speed is None:
        return ""
    parts = []
    if speed.samples_per_second is not None:
        parts.append(f"{_rate(speed.samples_per_second)} samples/s")
    if speed.steps_per_second is not None:
        parts.append(f"{speed.steps_per_second:.2f} steps/s")
    if speed.tokens_per_second is not None:
        parts.append(f"{_rate(speed.tokens_per_second)} tokens/s")
    split = _split(list(speed.ranks.values()))
    if split:
        parts.append(split)
    spread = _spread(speed.ranks) if len(speed.ranks) > GROUPED_ABOVE else ""
    if spread:
        parts.append(spread)
    if speed.mfu is not None:
        parts.append(f"MFU {speed.mfu:.1%}")
    if speed.straggler is not None:
        slow = speed.ranks[speed.straggler]
        node = (rank_nodes or {}).get(speed.straggler)
        where = f" on node {node}" if node is not None and _nodes(rank_nodes) > 1 else ""
        parts.append(
            f"straggler: rank {speed.straggler}{where} ({speed.straggler_cause} "
            f"{_ms(getattr(slow, speed.straggler_cause or 'compute'))})"
        )
    memory = _memory(speed.ranks)
    if memory:
        parts.append(memory)
    if not parts:
        return ""
    lines = ["speed: " + " · ".join(parts)]
    if rank_nodes and _nodes(rank_nodes) > GROUPED_ABOVE:
        lines.append(_nodes_line(speed.ranks, rank_nodes))
    elif rank_nodes and _nodes(rank_nodes) > 1:
        lines.extend(_node_lines(speed.ranks, rank_nodes))
    return "\n".join(line for line in lines if line)


def _spread(ranks: dict[int, RankSpeed]) -> str:
    """``median step 26.0 ms · slowest: rank 17 40.1 ms, rank 3 38.0 ms, rank 9 37.5 ms``:
    how the ranks' step times spread, where a mean over hundreds hides the slow ones."""
    steps = {rank: speed.step for rank, speed in ranks.items() if speed.step is not None}
    if len(steps) < 2:
        return ""
    slowest = sorted(steps, key=lambda rank: (-steps[rank], rank))[:_SLOWEST]
    named = ", ".join(f"rank {rank} {_ms(steps[rank])}" for rank in slowest)
    return f"median step {_ms(statistics.median(steps.values()))} · slowest: {named}"


def _nodes_line(ranks: dict[int, RankSpeed], rank_nodes: dict[int, int]) -> str:
    """One line for many nodes: their median step (each node's mean over its ranks) and the
    slowest nodes with their ranks, instead of a line per node."""
    members: dict[int, list[int]] = {}
    for rank, node in rank_nodes.items():
        members.setdefault(node, []).append(rank)
    steps: dict[int, float] = {}
    for node, numbers in members.items():
        timed = [ranks[r].step for r in numbers if r in ranks and ranks[r].step is not None]
        if timed:
            steps[node] = statistics.fmean(timed)  # type: ignore[arg-type]
    if not steps:
        return f"{len(members)} nodes: no step timed yet"
    slowest = sorted(steps, key=lambda node: (-steps[node], node))[:_SLOWEST]
    named = ", ".join(
        f"node {node} (ranks {rank_spec(members[node])}) {_ms(steps[node])}" for node in slowest
    )
    median = _ms(statistics.median(steps.values()))
    return f"{len(members)} nodes: median step {median} · slowest: {named}"


def _nodes(rank_nodes: dict[int, int] | None) -> int:
    return len(set((rank_nodes or {}).values()))


def _node_lines(ranks: dict[int, RankSpeed], rank_nodes: dict[int, int]) -> list[str]:
    lines = []
    for node in sorted(set(rank_nodes.values())):
        members = {rank: speed for rank, speed in ranks.items() if rank_nodes.get(rank) == node}
        if not members:
            continue
        numbers = sorted(members)
        who = f"rank {numbers[0]}" if len(numbers) == 1 else f"ranks {_span(numbers)}"
        parts = [part for part in (_split(list(members.values())), _memory(members)) if part]
        lines.append(f"node {node} ({who}): " + (" · ".join(parts) or "no step timed yet"))
    return lines


def _span(numbers: list[int]) -> str:
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}-{numbers[-1]}"
    return ", ".join(map(str, numbers))


def _split(ranks: list[RankSpeed]) -> str:
    """The mean step time of ``ranks`` and, where seen, its data, compute and wait parts."""
    timed = [speed for speed in ranks if speed.timed_steps]
    if not timed:
        return ""
    step = statistics.fmean(speed.step or 0.0 for speed in timed)
    parts = []
    for name in ("data", "compute", "wait"):
        values = [getattr(speed, name) for speed in timed]
        if all(value is not None for value in values) and (name == "compute" or any(values)):
            parts.append(f"{name} {_ms(statistics.fmean(values))}")
    seen = all(speed.data is not None or speed.wait is not None for speed in timed)
    return f"step {_ms(step)}" + (f" = {' + '.join(parts)}" if seen and parts else "")


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms"


def _rate(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e4:
        return f"{value / 1e3:.1f}k"
    return f"{value:.1f}"


def _memory(ranks: dict[int, RankSpeed]) -> str:
    cpu = [speed.peak_memory_bytes for speed in ranks.values() if speed.peak_memory_bytes]
    gpu = [speed.cuda_max_allocated for speed in ranks.values() if speed.cuda_max_allocated]
    reserved = [speed.cuda_max_reserved for speed in ranks.values() if speed.cuda_max_reserved]
    parts = [f"{_bytes(max(cpu))} CPU"] if cpu else []
    if gpu:
        held = f" ({_bytes(max(reserved))} reserved)" if reserved else ""
        parts.append(f"GPU {_bytes(max(gpu))} allocated{held}")
    return f"peak memory {', '.join(parts)} on the largest rank" if parts else ""


def _bytes(count: int) -> str:
    if count >= 2**30:
        return f"{count / 2**30:.1f} GiB"
    return f"{count / 2**20:.0f} MiB"


class SpeedPanel(Panel):
    """The speed line: under the plot while the run goes, under its summary and its saved plot
    at the end, ``[speed] …`` without a notebook, and ``last_run().speed``."""

    name = "speed"

    def __init__(self) -> None:
        self.tracker = SpeedTracker()
        self.nodes: dict[int, int] | None = None  # rank -> node, for a line per node
        self.logged = False  # a rank logged a metric

    def start(self, info: LaunchInfo) -> None:
        self.nodes = info.node_of()

    def take(self, message: WorkerMessage) -> None:
        if isinstance(message, MetricsBatch):
            self.tracker.take(message.rank, message.speed)
            self.logged = self.logged or bool(message.records)

    def live(self) -> str:
        """Empty until a rank counted a batch or logged a metric: such a run shows nothing new."""
        speed = self.tracker.speed()
        if speed is None or not (speed.steps or self.logged):
            return ""
        return speed_line(speed, self.nodes)

    summary = live

    def headless(self) -> str:
        line = self.live()
        return f"[{line.replace(': ', '] ', 1)}" if line else ""

    def record(self) -> Speed | None:
        return self.tracker.speed()
