"""The speed line: where the views show it, what it says, and when it stays away."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import notebook_kit.live.notebook_view as notebook_view
from notebook_kit.live.headless import HeadlessObserver
from notebook_kit.live.notebook_view import LiveObserver
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, RankSummary
from notebook_kit.live.record import last_run
from notebook_kit.live.speed import SpeedTracker, speed_line
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch, RankSpeed, decode
from notebook_kit.runtime.metrics import BATCH_KIND
from notebook_kit.runtime.throughput import SpeedCounter, batch_size

_MIB = 2**20
_SUMMARY = LaunchSummary((RankSummary(0, 0, 4.0), RankSummary(1, 0, 4.0)), 4.2)


def _batch(rank: int, speed: RankSpeed | None, steps: int = 4) -> dict[str, Any]:
    records = [(rank, step, {"loss": 1.0}) for step in range(steps)]
    message = MetricsBatch(rank, tuple(records), progress=None, speed=speed)
    return message.payload()


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    bundles: list[dict[str, Any]] = []
    monkeypatch.setattr(notebook_view, "display", lambda bundle, **_: bundles.append(bundle))
    return bundles


def test_rank_speed_travels_in_a_metrics_batch_and_old_senders_still_decode() -> None:
    speed = RankSpeed(samples=32, batches=4, tokens=100, seconds=2.0, peak_memory_bytes=7)
    decoded = decode(0, BATCH_KIND, _batch(1, speed))
    assert isinstance(decoded, MetricsBatch) and decoded.speed == speed
    old = decode(0, BATCH_KIND, {"rank": 1, "records": [], "steps": 0})
    assert isinstance(old, MetricsBatch) and old.speed is None


def test_the_global_rate_is_every_ranks_samples_over_the_longest_window() -> None:
    tracker = SpeedTracker()
    tracker.take(0, RankSpeed(samples=40, batches=5, seconds=2.0, peak_memory_bytes=300 * _MIB))
    tracker.take(1, RankSpeed(samples=40, batches=5, seconds=2.5, peak_memory_bytes=500 * _MIB))
    tracker.take(1, None)  # a batch that says nothing new keeps the last figures
    speed = tracker.speed()
    assert speed is not None
    assert (speed.samples, speed.steps, speed.seconds) == (80, 5, 2.5)
    assert speed.samples_per_second == 32.0 and speed.steps_per_second == 2.0
    assert speed_line(speed) == (
        "speed: 32.0 samples/s · 2.00 steps/s · peak memory 500 MiB CPU on the largest rank"
    )


def test_gpu_memory_and_tokens_join_the_line() -> None:
    ranks = {
        0: RankSpeed(
            64, 8, 30_000, 2.0, 2**30, cuda_max_allocated=3 * 2**30, cuda_max_reserved=4 * 2**30
        )
    }
    tracker = SpeedTracker()
    tracker.take(0, ranks[0])
    line = speed_line(tracker.speed())
    assert "15.0k tokens/s" in line and "GPU 3.0 GiB allocated (4.0 GiB reserved)" in line


def test_a_counter_counts_the_training_loader_only_and_log_samples_replace_it() -> None:
    counter = SpeedCounter()
    training, evaluation = object(), object()
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    counter.count_batch({"input_ids": torch.zeros(2, 3), "attention_mask": mask}, training)
    counter.count_batch({"input_ids": torch.zeros(5, 3)}, evaluation)
    first = counter.snapshot()
    assert (first.samples, first.batches, first.tokens) == (2, 1, 3)
    assert first.peak_memory_bytes is not None and first.peak_memory_bytes > 0
    counter.count_samples(7)
    counter.count_batch((torch.zeros(9, 2), torch.zeros(9)), training)  # ignored from now on
    assert (counter.snapshot().samples, counter.snapshot().batches) == (7, 1)
    assert batch_size(["a", "b", "c"]) == 3 and batch_size(torch.tensor(1.0)) == 1


def test_the_live_view_shows_the_speed_line_under_the_plot_and_in_the_summary(
    shown: list[dict[str, Any]],
) -> None:
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(LaunchInfo("Launching 2 processes", 2, 2, (0, 1), flag))
    assert observer.speed is None  # nothing counted yet: no line, no model
    speed = RankSpeed(samples=32, batches=4, seconds=2.0, peak_memory_bytes=300 * _MIB)
    observer.on_message(0, BATCH_KIND, _batch(0, speed))
    observer.on_tick()
    assert observer.speed is not None and "16.0 samples/s" in observer.speed.value
    children = list(observer.box.children)  # type: ignore[union-attr]
    assert children.index(observer.speed) == children.index(observer.plot.widgets[-1]) + 1
    observer.on_finish(_SUMMARY)
    text = shown[1]["text/plain"].splitlines()
    assert (
        text[1]
        == "speed: 16.0 samples/s · 2.00 steps/s · peak memory 300 MiB CPU on the largest rank"
    )
    assert 'class="nk-speed"' in shown[1]["text/html"]
    record = last_run()
    assert record is not None and record.speed is not None and record.speed.samples == 32
    flag.close()


def test_without_counts_or_metrics_the_views_show_nothing_new(
    shown: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    memory_only = RankSpeed(peak_memory_bytes=300 * _MIB)
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(LaunchInfo("Launching 2 processes", 2, 2, (0, 1), flag))
    observer.on_message(0, BATCH_KIND, _batch(0, memory_only, steps=0))
    observer.on_tick()
    observer.on_finish(_SUMMARY)
    assert observer.speed is None and "speed" not in shown[1]["text/plain"]
    flag.close()
    headless = HeadlessObserver()
    headless.on_metrics(MetricsBatch(0, (), speed=memory_only))
    headless.on_finish(_SUMMARY)
    assert "[speed]" not in capsys.readouterr().out
