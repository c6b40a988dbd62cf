"""One size of ``benchmarks.scale``: a run that is stopped, and a run whose rank fails.

The kernel side is the real one, in this process: ``notebook_launcher(cluster=...)``, its
cluster attempt's loop, and :class:`~notebook_kit.live.headless.QuietObserver` with every
panel of the view (record, plot feed, speed line, ranks' output, Stop). :class:`Watched` adds
only a reading of the plot feed's newest point at each tick.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from benchmarks._scale_node import ScaleSpec, simulated_rank
from notebook_kit.errors import WorkerError
from notebook_kit.live.headless import QuietObserver
from notebook_kit.live.observer import LaunchInfo
from notebook_kit.runtime.messages import MetricsBatch

__all__ = ["Rates", "ScaleResult", "measure_size", "warm_up"]

_SAMPLE_SECONDS = 0.1  # the newest point's age is read this often
_SETTLE_SECONDS = 2.0  # after every rank's first point, before the measured window
_POINTS_DUE_SECONDS = 10.0  # every rank's lines came: its points come within this, or never
MIB = 1 << 20


@dataclass(frozen=True)
class Rates:
    """What each simulated rank sends per second, and how long the window lasts."""

    metrics: float = 2.0
    lines: float = 1.0
    seconds: float = 10.0
    fail_after: float = 4.0  # seconds after its node started, the failing rank raises
    start_timeout: float = 300.0  # every rank's first point, at most this long after the call
    patience: float = 30.0  # for every rank to stop, or for the failure's error; then Ctrl-C


@dataclass
class ScaleResult:
    """One size's figures (seconds, shares of one core, MiB)."""

    ranks: int
    nodes: int
    kernel_cpu: float = 0.0
    scheduler_cpu: float = 0.0
    kernel_rss_growth: float = 0.0
    newest_point: float = 0.0  # 95th percentile of the age over the window
    newest_point_median: float = 0.0
    newest_point_max: float = 0.0
    ranks_seen: int = 0  # ranks with a point in the plot feed
    lines_seen: int = 0
    stop: float | None = None  # Stop to the last rank stopped; None: not every rank stopped
    ranks_stopped: int = 0
    failure_named: float | None = None  # None: the error did not name the failed rank
    failure_raised: float | None = None  # the failed rank's raise to the WorkerError
    failed_rank_named: int | None = None
    notes: list[str] = field(default_factory=list)


class Watched(QuietObserver):
    """The quiet view (every panel), noting the plot feed's newest point at each tick."""

    def __init__(self) -> None:
        super().__init__()
        self.newest = 0.0  # the "sent" value of the plot's newest point (seconds since epoch)
        self.ranks: set[int] = set()
        self.lines = 0
        self.printing: set[int] = set()  # ranks whose lines arrived
        self.info: LaunchInfo | None = None

    def on_start(self, info: LaunchInfo) -> None:
        super().on_start(info)
        self.info = info

    def on_metrics(self, batch: MetricsBatch) -> None:
        super().on_metrics(batch)
        self.ranks.add(batch.rank)

    def on_output(self, rank: int, stream: Any, line: str) -> None:
        super().on_output(rank, stream, line)
        self.lines += 1
        self.printing.add(rank)

    def on_tick(self) -> None:
        super().on_tick()
        sent = self.recorder.metrics.latest().get("sent")
        if sent is not None:
            self.newest = max(self.newest, sent)


def measure_size(
    cluster: Any, scheduler: list[psutil.Process], ranks: int, per_node: int, rates: Rates
) -> ScaleResult:
    """Both runs of one size on ``cluster``; ``scheduler``: its processes, for their CPU."""
    result = ScaleResult(ranks, ranks // per_node)
    _stopped_run(cluster, scheduler, result, per_node, rates)
    _failing_run(cluster, result, per_node, rates)
    return result


def warm_up(cluster: Any, scheduler: list[psutil.Process], per_node: int, rates: Rates) -> None:
    """One short run of one node, not reported: the kernel imports what a cluster run uses and
    the workers start their zygotes, so the first size's memory growth is the run's own."""
    short = Rates(rates.metrics, rates.lines, 0.5, rates.fail_after, rates.start_timeout)
    _stopped_run(cluster, scheduler, ScaleResult(per_node, 1), per_node, short)


def _launch(cluster: Any, spec: ScaleSpec, nodes: int, per_node: int, observer: Any) -> Any:
    from notebook_kit import notebook_launcher

    return notebook_launcher(
        simulated_rank, args=(spec,), cluster=cluster, num_nodes=nodes,
        num_processes=per_node, observer=observer,
    )  # fmt: skip


def _interrupt_unless(done: threading.Event, seconds: float) -> None:
    """Ctrl-C for the launch on the main thread unless ``done`` is set within ``seconds``, as
    a user would press it: a run whose ranks never stop ends, and says so."""

    def wait() -> None:
        if not done.wait(seconds):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=wait, daemon=True).start()


def _stopped_run(
    cluster: Any, scheduler: list[psutil.Process], result: ScaleResult, per_node: int, rates: Rates
) -> None:
    """Ranks send at their rates; the window is measured; then Stop is pressed."""
    run_dir = Path(tempfile.mkdtemp(prefix="nk_scale_"))
    spec = ScaleSpec(str(run_dir), time.time(), rates.metrics, rates.lines)
    observer = Watched()
    kernel = psutil.Process()
    rss_before = kernel.memory_info().rss
    pressed: list[float] = []
    returned = threading.Event()
    watcher = threading.Thread(
        target=_watch,
        args=(observer, spec, kernel, scheduler, result, rates, pressed, rss_before, returned),
        daemon=True,
    )
    watcher.start()
    try:
        _launch(cluster, spec, result.nodes, per_node, observer)
    except KeyboardInterrupt:
        result.notes.append(
            f"Stop had not ended every rank {rates.patience:g} s after it was pressed: interrupted"
            if pressed
            else f"only {len(observer.ranks)} of {result.ranks} ranks sent a point within "
            f"{rates.start_timeout:g} s: interrupted"
        )
    except WorkerError as error:  # the next sizes are still measured; the table says why
        why = (str(error).splitlines() or [""])[0]
        result.notes.append(f"the run ended with {type(error).__name__} before Stop: {why}")
    finally:
        returned.set()
    watcher.join(timeout=5)
    stopped = _read_nodes(run_dir, "stopped")
    result.ranks_stopped = len(stopped)
    result.ranks_seen, result.lines_seen = len(observer.ranks), observer.lines
    if pressed and stopped and len(stopped) == result.ranks:
        result.stop = max(stopped) - pressed[0]


def _watch(
    observer: Watched,
    spec: ScaleSpec,
    kernel: psutil.Process,
    scheduler: list[psutil.Process],
    result: ScaleResult,
    rates: Rates,
    pressed: list[float],
    rss_before: int,
    returned: threading.Event,
) -> None:
    """Wait for every rank's first point, measure the window, press Stop."""
    deadline = time.monotonic() + rates.start_timeout
    while len(observer.ranks) < result.ranks or observer.info is None:
        if returned.is_set():  # the launch ended already (a failure): nothing to measure
            return
        if len(observer.printing) == result.ranks:  # every rank runs: its points are due
            deadline = min(deadline, time.monotonic() + _POINTS_DUE_SECONDS)
        if time.monotonic() > deadline:
            os.kill(os.getpid(), signal.SIGINT)  # the launch ends; the notes say why
            return
        time.sleep(_SAMPLE_SECONDS)
    time.sleep(_SETTLE_SECONDS)
    cpu = [_cpu(kernel), sum(_cpu(p) for p in scheduler)]
    started, ages, rss_peak = time.monotonic(), [], kernel.memory_info().rss
    while time.monotonic() - started < rates.seconds:
        time.sleep(_SAMPLE_SECONDS)
        ages.append(time.time() - spec.epoch - observer.newest)
        rss_peak = max(rss_peak, kernel.memory_info().rss)
    wall = time.monotonic() - started
    result.kernel_cpu = (_cpu(kernel) - cpu[0]) / wall
    result.scheduler_cpu = (sum(_cpu(p) for p in scheduler) - cpu[1]) / wall
    result.kernel_rss_growth = (rss_peak - rss_before) / MIB
    ages.sort()
    result.newest_point = ages[int(0.95 * (len(ages) - 1))]
    result.newest_point_median = statistics.median(ages)
    result.newest_point_max = ages[-1]
    pressed.append(time.time())
    observer.info.stop_flag.set()  # what the Stop button does
    _interrupt_unless(returned, rates.patience)


class _Notices(io.TextIOBase):
    """The kernel's printed lines, passed on, with when the first naming ``rank`` came."""

    def __init__(self, rank: int, out: Any) -> None:
        self.words, self.out, self.at = f"Rank {rank} (", out, None

    def write(self, text: str) -> int:
        if self.at is None and self.words in text:
            self.at = time.time()
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def _failing_run(cluster: Any, result: ScaleResult, per_node: int, rates: Rates) -> None:
    """The last rank raises a few seconds in: seconds until the kernel names it (the notice
    printed while the other nodes end, or the ``WorkerError``, whichever comes first) and
    until the error is raised."""
    from notebook_kit.errors import choose_root_cause

    run_dir = Path(tempfile.mkdtemp(prefix="nk_scale_fail_"))
    failing = result.ranks - 1
    spec = ScaleSpec(
        str(run_dir), time.time(), rates.metrics, rates.lines, fail_rank=failing,
        fail_after=rates.fail_after,
    )  # fmt: skip
    returned = threading.Event()
    _interrupt_unless(returned, rates.start_timeout + rates.fail_after + rates.patience)
    notices = _Notices(failing, sys.stdout)
    try:
        with contextlib.redirect_stdout(notices):
            _launch(cluster, spec, result.nodes, per_node, QuietObserver())
    except KeyboardInterrupt:
        result.notes.append("the failing run was interrupted: no error named the failure")
        return
    except WorkerError as error:
        raised = time.time()
        root = choose_root_cause(list(error.failures))
        result.failed_rank_named = root.rank
        failed = _read_nodes(run_dir, "failed")
        if root.rank == failing and failed:
            result.failure_raised = raised - failed[0]
            result.failure_named = min(notices.at or raised, raised) - failed[0]
        return
    finally:
        returned.set()
    result.notes.append("the failing run returned without an error")


def _read_nodes(run_dir: Path, key: str) -> list[float]:
    """Every rank's time of ``key`` ("stopped": when each saw Stop; "failed": the raise)."""
    times: list[float] = []
    for path in run_dir.glob("node-*.json"):
        value = json.loads(path.read_text())[key]
        if isinstance(value, dict):
            times.extend(value.values())
        elif value is not None:
            times.append(value)
    return times


def _cpu(process: psutil.Process) -> float:
    """CPU seconds of ``process`` so far (0 once it is gone)."""
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system
