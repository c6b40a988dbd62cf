"""Kernel side of progress, run in the kernel: what rank 0 reported, its rate from the first step.

The rate and the ETA are measured from the first training step the kernel sees, not from the
launch: forking, imports and the rendezvous would otherwise make the first seconds look slow.
The notebook's bar is :mod:`notebook_kit.live.progress_bar`; without a notebook, progress is a
line of text (:func:`progress_line`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from notebook_kit.live.metric_names import named_values
from notebook_kit.runtime.messages import MetricsBatch, Progress

__all__ = [
    "ProgressState",
    "RateClock",
    "format_duration",
    "format_rate",
    "progress_line",
    "progress_text",
]

_SHOWN_METRICS = 5  # newest values in a progress line; the others are counted


@dataclass
class ProgressState:
    """Rank 0's progress over every attempt of a launch: the steps taken, counted once.

    A restarted attempt counts from zero again, yet resumes part-way (its first logged step).
    The steps before that point count as taken, once: the count is those plus the
    attempt's own, unless its counter already starts there (the Trainer reports its global
    step). Without a counter, the last logged step says how far it got; a launch whose first
    logged step is 1 numbers its steps from 1 (the Trainer's global step), not 0.

    Example:
        >>> state = ProgressState(); state.update(Progress(steps=5, total=10)); state.count
        5
        >>> state.first_logged = 0; state.resume_at(30, 32, 3); state.steps = 30; state.count
        60
    """

    steps: int = 0
    total: int | None = None
    epoch_length: int | None = None
    last_logged_step: int | None = None
    first_logged: int | None = None  # the launch's first logged step (set by the recorder)
    before: int = 0  # steps taken before the running attempt resumed

    def update(self, progress: Progress) -> None:
        """Take rank 0's progress counters."""
        if progress.steps is not None:
            self.steps = progress.steps
        self.total = progress.total
        if progress.epoch_length is not None and self.epoch_length is None:
            self.epoch_length = progress.epoch_length

    def take_batch(self, batch: MetricsBatch) -> None:
        """Follow rank 0: its counters, and the steps it logged."""
        if batch.rank != 0:
            return
        if batch.progress is not None:
            self.update(batch.progress)
        for _, step, _ in batch.records:
            if step is not None:
                self.last_logged_step = max(int(step), self.last_logged_step or 0)

    @property
    def _first_number(self) -> int:
        return 1 if self.first_logged == 1 else 0

    def resume_at(self, step: int, logged: int, counted: int) -> None:
        """A restarted attempt logged from ``step`` to ``logged`` in its first batch, in which
        rank 0 had counted ``counted`` steps."""
        before = max(step - self._first_number, 0)
        # A counter that starts where the checkpoint left it (the Trainer's global step)
        # already holds the steps before it: more than this attempt has logged.
        self.before = 0 if before and counted >= before + logged - step + 1 else before

    @property
    def count(self) -> int:
        """Steps taken: counted ones and those before a resume, else the last step logged."""
        if self.steps:
            return self.before + self.steps
        if self.last_logged_step is None:
            return 0
        return self.last_logged_step - self._first_number + 1

    @property
    def expected(self) -> int | None:
        """The total, explicit or from the epoch length (grows by an epoch when one is passed)."""
        if self.total is not None:
            return self.total
        if self.epoch_length:
            epochs = max(1, -(-self.count // self.epoch_length))
            return self.epoch_length * epochs
        return None


def format_duration(seconds: float) -> str:
    """``mm:ss``, or ``h:mm:ss`` from an hour on.

    Example:
        >>> format_duration(75.4), format_duration(3725)
        ('01:15', '1:02:05')
    """
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


@dataclass
class RateClock:
    """Steps per second since the first step was seen (launch and setup time left out).

    Example:
        >>> clock = RateClock(); clock.observe(5, now=10.0); clock.observe(25, now=12.0)
        >>> clock.rate, clock.eta(125)
        (10.0, 10.0)
    """

    first_count: int | None = None
    first_time: float = 0.0
    count: int = 0
    count_time: float = 0.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def observe(self, count: int, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        if count > 0 and self.first_count is None:
            self.first_count, self.first_time = count, now
        if count != self.count:
            self.count, self.count_time = count, now

    @property
    def rate(self) -> float | None:
        """None until two different counts were seen."""
        if self.first_count is None or self.count <= self.first_count:
            return None
        elapsed = self.count_time - self.first_time
        return (self.count - self.first_count) / elapsed if elapsed > 0 else None

    def eta(self, total: int | None) -> float | None:
        rate = self.rate
        if rate is None or not total or total <= self.count:
            return None
        return (total - self.count) / rate

    def elapsed(self, now: float | None = None) -> float:
        """Seconds since the first step (0 before it)."""
        if self.first_count is None:
            return 0.0
        return (self.clock() if now is None else now) - self.first_time


def format_rate(rate: float) -> str:
    """Steps per second, or seconds per step when slower than one a second.

    Example:
        >>> format_rate(52.13), format_rate(0.4)
        ('52.1 steps/s', '2.50 s/step')
    """
    if rate >= 1:
        return f"{rate:.1f} steps/s" if rate < 1000 else f"{rate:.0f} steps/s"
    return f"{1 / rate:.2f} s/step"


def progress_text(count: int, total: int | None, clock: RateClock, now: float | None = None) -> str:
    """The words beside the bar: ``62% · 288/460 · 00:05<00:03 · 52.1 steps/s``.

    Example:
        >>> clock = RateClock(); clock.observe(10, now=0.0); clock.observe(60, now=1.0)
        >>> progress_text(60, None, clock, now=1.0)
        '60 steps · 00:01 · 50.0 steps/s'
        >>> progress_text(60, 120, clock, now=1.0)
        '50% · 60/120 · 00:01<00:01 · 50.0 steps/s'
    """
    if not count:
        return "waiting for the first step…"
    elapsed = format_duration(clock.elapsed(now))
    eta = clock.eta(total)
    rate = clock.rate
    parts = [f"{count} steps" if not total else f"{100 * count // total}% · {count}/{total}"]
    parts.append(f"{elapsed}<{format_duration(eta)}" if eta is not None else elapsed)
    if rate is not None:
        parts.append(format_rate(rate))
    return " · ".join(parts)


def progress_line(
    count: int,
    total: int | None,
    elapsed: float,
    latest: dict[str, float],
    dropped: int = 0,
    rate: float | None = None,
) -> str:
    """One line of progress: steps, rate, ETA and the newest metric values.

    ``rate`` (steps per second, 0 for unknown) defaults to ``count / elapsed``; the views
    pass the rate measured from the first step (:class:`~notebook_kit.live.progress.RateClock`).

    Example:
        >>> progress_line(50, 100, 10.0, {"loss": 0.5})
        'step 50/100 (50%) · 5.00 steps/s · ETA 00:10 · loss 0.5'
    """
    parts = [f"step {count}/{total} ({100 * count // total}%)" if total else f"step {count}"]
    if rate is None:
        rate = count / elapsed if count and elapsed > 0 else 0.0
    if rate > 0:
        parts.append(f"{rate:.2f} steps/s")
        if total and total > count:
            parts.append(f"ETA {format_duration((total - count) / rate)}")
    parts += named_values(latest, _SHOWN_METRICS, "{:.4g}".format)
    if dropped:
        parts.append(f"{dropped} metric records dropped")
    return " · ".join(parts)
