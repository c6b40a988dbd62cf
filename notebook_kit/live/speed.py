"""Kernel side of the speed figures: every rank's counts turned into rates, and their line.

Each rank counts the samples, batches and tokens it trained on and reads its memory peaks
(:mod:`notebook_kit.runtime.throughput`); its metrics batches carry the latest counts as a
:class:`~notebook_kit.runtime.messages.RankSpeed`. Here they become the run's figures:
samples/s over all ranks (the global rate, as the Hugging Face Trainer reports it), steps/s,
tokens/s, and each rank's memory, shown as one line under the plot and kept in
``last_run().speed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from notebook_kit.runtime.messages import RankSpeed

__all__ = ["Speed", "SpeedTracker", "speed_line"]


@dataclass(frozen=True)
class Speed:
    """How fast a run trained, from what its ranks counted.

    Attributes:
        samples: Samples counted, all ranks together.
        steps: Batches counted by the rank that counted most.
        tokens: Non-padding tokens, all ranks together; None when no batch carried tokens.
        seconds: The counting window: from a rank's first counted batch to the end of its
            function (or its latest count while running), the longest over ranks.
        samples_per_second: ``samples / seconds``.
        steps_per_second: ``steps / seconds``.
        tokens_per_second: ``tokens / seconds``, or None without tokens.
        ranks: Each rank's own counts and memory peaks.

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

    @property
    def peak_memory_bytes(self) -> dict[int, int | None]:
        """Each rank's peak resident memory (CPU), in bytes."""
        return {rank: speed.peak_memory_bytes for rank, speed in self.ranks.items()}


class SpeedTracker:
    """The latest counts of every rank, as their metrics batches bring them.

    Example::

        tracker = SpeedTracker(); tracker.take(batch); tracker.speed()
    """

    def __init__(self) -> None:
        self.ranks: dict[int, RankSpeed] = {}

    def take(self, rank: int, speed: RankSpeed | None) -> None:
        if speed is not None:
            self.ranks[rank] = speed

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
        timed = seconds > 0 and steps > 0
        return Speed(
            samples=samples,
            steps=steps,
            tokens=tokens,
            seconds=seconds,
            samples_per_second=samples / seconds if timed else None,
            steps_per_second=steps / seconds if timed else None,
            tokens_per_second=tokens / seconds if timed and tokens is not None else None,
            ranks=ranks,
        )


def speed_line(speed: Speed | None) -> str:
    """One line: samples/s, steps/s and tokens/s when counted, and the memory peaks.

    Empty when no rank sent any figure.

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
    memory = _memory(speed.ranks)
    if memory:
        parts.append(memory)
    return "speed: " + " · ".join(parts) if parts else ""


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
