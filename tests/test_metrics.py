"""The metrics channel and the kernel-side aggregation, without processes or a kernel."""

from __future__ import annotations

import threading
import tracemalloc
from typing import Any

import pytest
import torch

from notebook_kit.live import metrics as live_metrics
from notebook_kit.live.metrics import MetricsAggregator
from notebook_kit.live.observer import LaunchSummary, RankSummary
from notebook_kit.live.progress import ProgressState, progress_line
from notebook_kit.live.record import RunRecorder, last_run
from notebook_kit.runtime import metrics, progress
from notebook_kit.runtime.codec import ProtocolError
from notebook_kit.runtime.context import LaunchContext
from notebook_kit.runtime.messages import MetricsBatch, Progress, decode, encode
from notebook_kit.runtime.metrics import WorkerChannel


def test_mean_over_ranks_per_step_and_per_rank_values_kept() -> None:
    aggregator = MetricsAggregator()
    aggregator.add(0, 0, {"loss": 1.0})
    aggregator.add(1, 0, {"loss": 3.0})
    aggregator.add(1, 1, {"loss": 5.0})
    aggregator.add(0, 10, {"val_loss": 0.5})
    assert aggregator.history("loss") == [(0, 2.0), (1, 5.0)]
    assert aggregator.rank_history("loss", 1) == [(0, 3.0), (1, 5.0)]
    assert aggregator.history("val_loss") == [(10, 0.5)]
    assert aggregator.latest() == {"loss": 5.0, "val_loss": 0.5}
    assert aggregator.rank_histories()[0] == {"loss": [(0, 1.0)], "val_loss": [(10, 0.5)]}


def test_steps_default_to_each_ranks_call_count() -> None:
    aggregator = MetricsAggregator()
    for value in (1.0, 2.0):
        aggregator.add(0, None, {"loss": value})
        aggregator.add(1, None, {"loss": value + 2})
    assert aggregator.history("loss") == [(0, 2.0), (1, 3.0)]


def test_single_records_from_the_accelerator_are_understood() -> None:
    aggregator = MetricsAggregator()
    taken = decode(encode(MetricsBatch(1, ((1, 3, {"acc": 0.5}),), None, None)))
    assert isinstance(taken, MetricsBatch)
    aggregator.add_batch(taken)
    assert taken and aggregator.history("acc") == [(3, 0.5)]
    with pytest.raises(ProtocolError):
        decode(b"something else")


def _context(send: Any, rank: int = 0, world_size: int = 2) -> LaunchContext:
    return LaunchContext(rank=rank, world_size=world_size, send=send)


def test_a_blocked_kernel_never_blocks_log_and_drops_are_counted() -> None:
    sent: list[bytes] = []
    release = threading.Event()

    def slow_send(message: Any) -> None:
        release.wait(10)  # the kernel is not reading: the pipe is full
        sent.append(encode(message))

    context = _context(slow_send)
    channel = WorkerChannel(context, capacity=100)
    context.extensions["metrics"] = channel  # the channel's slot on the launch
    for step in range(1000):
        metrics.log_from_worker(context, {"loss": float(step)}, step=step)
    # The sender thread may hold one batch in its blocked send; 100 records wait in the
    # buffer and the newest beside it; the rest is dropped.
    assert 799 <= channel.dropped <= 899
    release.set()
    metrics.close_channel(context)
    aggregator = MetricsAggregator()
    for data in sent:
        aggregator.add_batch(decode(data))  # type: ignore[arg-type]
    received = len(aggregator.history("loss"))
    assert received + channel.dropped == 1000
    assert aggregator.total_dropped == channel.dropped
    assert aggregator.history("loss")[-1] == (999, 999.0)  # the newest, exactly as logged


def test_values_are_read_when_logged_and_unreadable_ones_left_out() -> None:
    sent: list[Any] = []
    context = _context(lambda message: sent.append(decode(encode(message))))
    loss = torch.tensor(2.0)
    metrics.log_from_worker(context, {"loss": loss, "name": "not a number", "acc": 1}, step=0)
    loss += 1  # a later in-place change must not alter what was logged
    metrics.close_channel(context)
    (batch,) = sent
    assert isinstance(batch, MetricsBatch)
    assert batch.records == ((0, 0, {"loss": 2.0, "acc": 1.0}),)


def test_world_of_one_sends_directly_without_a_thread() -> None:
    sent: list[Any] = []
    context = _context(sent.append, world_size=1)
    metrics.log_from_worker(context, {"loss": 1.0}, step=0)
    progress.advance(context)
    assert [b.records for b in sent] == [((0, 0, {"loss": 1.0}),), ()]
    assert sent[-1].progress.steps == 1
    assert metrics.channel(context)._thread is None


def test_outside_a_launch_logging_does_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    import notebook_kit

    threads = set(threading.enumerate())
    unlaunched = LaunchContext(send=None)
    metrics.log_from_worker(None, {"loss": 1.0})
    metrics.log_from_worker(unlaunched, {"loss": 1.0})
    progress.report_total(None, 10)
    progress.report_total(unlaunched, 10)
    metrics.flush(None)
    metrics.flush(unlaunched)
    notebook_kit.log({"loss": torch.tensor(1.0)}, step=3)
    notebook_kit.progress(total=10)
    assert notebook_kit.should_stop() is False
    # No channel, sender thread or progress state was made, and nothing was printed.
    assert unlaunched.extensions == {}
    assert set(threading.enumerate()) == threads
    assert capsys.readouterr() == ("", "")
    with pytest.raises(TypeError, match=r"progress\(total=...\)"):  # still checked outside
        notebook_kit.progress(total=-1)


def test_progress_uses_total_then_epoch_length_then_logged_steps() -> None:
    state = ProgressState()
    state.take_batch(MetricsBatch(0, ((0, 4, {"loss": 1.0}),), progress=Progress(0)))
    assert (state.count, state.expected) == (5, None)
    state.take_batch(MetricsBatch(0, (), progress=Progress(12, epoch_length=10)))
    assert (state.count, state.expected) == (12, 20)  # into the second epoch
    state.take_batch(MetricsBatch(0, (), progress=Progress(12, 40)))
    assert state.expected == 40
    state.take_batch(MetricsBatch(1, (), progress=Progress(99)))  # only rank 0 counts
    assert state.count == 12


def test_progress_line_is_compact() -> None:
    line = progress_line(50, 100, 10.0, {"loss": 0.123456}, dropped=3)
    assert line == (
        "step 50/100 (50%) · 5.00 steps/s · ETA 00:10 · loss 0.1235 · 3 metric records dropped"
    )
    assert progress_line(0, None, 0.0, {}) == "step 0"


def test_recorder_keeps_the_last_run() -> None:
    recorder = RunRecorder()
    recorder.on_metrics(MetricsBatch(0, ((0, 0, {"loss": 1.0}),), None))
    recorder.on_metrics(MetricsBatch(1, ((1, 0, {"loss": 2.0}),), None))
    summary = LaunchSummary(
        ranks=(RankSummary(0, 0, 1.5), RankSummary(1, 0, 1.4)), duration=1.6, stopped=True
    )
    record = recorder.finish(summary)
    assert last_run() is record
    assert record.metrics == {"loss": [(0, 1.5)]}
    assert record.rank_metrics[1] == {"loss": [(0, 2.0)]}
    assert record.exit_codes == {0: 0, 1: 0}
    assert record.durations[1] == pytest.approx(1.4)
    assert record.stopped and record.succeeded


def _feed(aggregator: MetricsAggregator, start: int, stop: int, ranks: int = 2) -> None:
    """What ``ranks`` workers logging ``loss`` (= step + rank) at every step send, in batches."""
    for first in range(start, stop, 1000):
        for rank in range(ranks):
            records = [(rank, s, {"loss": float(s + rank)}) for s in range(first, first + 1000)]
            aggregator.add_batch(MetricsBatch(rank, tuple(records), progress=Progress()))


def _held_by_the_aggregator() -> int:
    """Bytes still allocated by code of the aggregator's module: what it keeps, and only that.

    Threads other tests of the session left running allocate meanwhile too; the whole
    process's traced memory counted them."""
    snapshot = tracemalloc.take_snapshot()
    mine = snapshot.filter_traces([tracemalloc.Filter(True, live_metrics.__file__)])
    return sum(stat.size for stat in mine.statistics("filename"))


def test_memory_stays_bounded_however_many_records_arrive() -> None:
    aggregator = MetricsAggregator()
    tracemalloc.start()
    try:
        _feed(aggregator, 0, 50_000)
        after_50k = _held_by_the_aggregator()
        _feed(aggregator, 50_000, 250_000)
        after_250k, peak = _held_by_the_aggregator(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50e6
    assert after_250k - after_50k < 1e6, "memory grows with the number of records"
    assert len(aggregator.history("loss")) <= 2048
    assert sum(len(h) for r in aggregator.rank_histories().values() for h in r.values()) <= 4096


def test_a_long_history_stays_truthful() -> None:
    aggregator = MetricsAggregator()
    _feed(aggregator, 0, 54_000)
    aggregator.add(1, 54_321, {"loss": 1e6})  # a spike, logged once, merged with others later
    _feed(aggregator, 54_000, 100_000)
    history = aggregator.history("loss")
    steps = [step for step, _ in history]
    assert steps == sorted(steps) and 1024 <= len(history) <= 2048
    assert steps[0] >= 0 and steps[-1] <= 99_999
    # Each point is the mean of the steps it covers, drawn at their middle step.
    quiet = [(step, value) for step, value in history if abs(step - 54_321) > 200]
    assert all(abs(value - (step + 0.5)) <= 1 for step, value in quiet)
    stats = aggregator.stats("loss")
    assert (stats.count, stats.min, stats.max) == (200_001, 0.0, 1e6)
    assert (stats.first_step, stats.last_step) == (0, 99_999)
    assert stats.last == aggregator.latest()["loss"] == 99_999.5
    assert stats.steps_per_point == 64
    assert aggregator.stats("loss", rank=0).count == 100_000
    spike = max(aggregator.envelope("loss"), key=lambda point: point[2])
    assert abs(spike[0] - 54_321) <= 64 and spike[2] == 1e6
    # The newest step is its own point, exactly as logged; the one before holds 99,968-99,998.
    assert aggregator.rank_history("loss", 0)[-2:] == [(99_983, 99_983.0), (99_999, 99_999.0)]


def test_the_newest_logged_step_is_its_own_point_exactly_as_logged() -> None:
    aggregator = MetricsAggregator()
    _feed(aggregator, 0, 20_000)
    history, envelope = aggregator.history("loss"), aggregator.envelope("loss")
    assert len(history) <= live_metrics.MAX_POINTS and aggregator.stats("loss").steps_per_point > 1
    assert history[-1] == (19_999, 19_999.5)  # the mean over ranks of step 299,999 alone
    assert envelope[-1] == (19_999, 19_999.0, 20_000.0)
    assert history[-2][0] < 19_999 and aggregator.latest()["loss"] == history[-1][1]
    # A later step takes its place; the step before joins the merged points, nothing lost.
    aggregator.add(0, 20_000, {"loss": -1.0})
    assert aggregator.history("loss")[-1] == (20_000, -1.0)
    assert aggregator.stats("loss").count == 40_001
    assert aggregator.envelope("loss")[-2][2] == 20_000.0
