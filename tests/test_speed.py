"""The speed line: where the views show it, what it says, and when it stays away."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import msgpack
import pytest
import torch

import notebook_kit.live.notebook_view as notebook_view
from notebook_kit.live.headless import HeadlessObserver
from notebook_kit.live.notebook_view import LiveObserver
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, RankSummary
from notebook_kit.live.plot import draw_metrics, new_figure
from notebook_kit.live.record import last_run
from notebook_kit.live.speed import SpeedTracker, _lagging, speed_line
from notebook_kit.runtime.context import LaunchContext, StopFlag
from notebook_kit.runtime.messages import MetricsBatch, Progress, RankSpeed, decode, encode
from notebook_kit.runtime.metrics import step_clock, waiting_on_ranks
from notebook_kit.runtime.peak_flops import peak_flops
from notebook_kit.runtime.throughput import (
    SpeedCounter,
    StepClock,
    batch_size,
    model_flops,
    watch_gradients,
)

_MIB = 2**20
_SUMMARY = LaunchSummary((RankSummary(0, 0, 4.0), RankSummary(1, 0, 4.0)), 4.2)


def _batch(rank: int, speed: RankSpeed | None, steps: int = 4) -> MetricsBatch:
    records = [(rank, step, {"loss": 1.0}) for step in range(steps)]
    return MetricsBatch(rank, tuple(records), progress=Progress(0), speed=speed)


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    bundles: list[dict[str, Any]] = []
    monkeypatch.setattr(notebook_view, "display", lambda bundle, **_: bundles.append(bundle))
    return bundles


def test_rank_speed_travels_in_a_metrics_batch_and_old_senders_still_decode() -> None:
    speed = RankSpeed(samples=32, batches=4, tokens=100, seconds=2.0, peak_memory_bytes=7)
    decoded = decode(encode(_batch(1, speed)))
    assert isinstance(decoded, MetricsBatch) and decoded.speed == speed
    fields = msgpack.packb(["MetricsBatch", [1, [], 0, None]])  # a sender without speed
    old = decode(msgpack.packb(msgpack.ExtType(1, fields)))
    assert isinstance(old, MetricsBatch) and old.speed is None


def test_the_global_rate_is_every_ranks_samples_over_the_longest_window() -> None:
    tracker = SpeedTracker()
    counted = RankSpeed(samples=40, batches=5, seconds=2.0, timed_steps=4, step_seconds=1.6)
    tracker.take(0, dataclasses.replace(counted, peak_memory_bytes=300 * _MIB))
    tracker.take(1, dataclasses.replace(counted, seconds=2.5, peak_memory_bytes=500 * _MIB))
    tracker.take(1, None)  # a batch that says nothing new keeps the last figures
    speed = tracker.speed()
    assert speed is not None
    assert (speed.samples, speed.steps, speed.seconds) == (80, 5, 2.5)
    assert speed.samples_per_second == 32.0 and speed.steps_per_second == 2.0
    assert speed_line(speed) == (
        "speed: 32.0 samples/s · 2.00 steps/s · step 400.0 ms · peak memory 500 MiB CPU on the "
        "largest rank"
    )


def test_no_rate_until_every_rank_that_counted_has_timed_a_step() -> None:
    tracker = SpeedTracker()  # a resumed run that broke out at its first batch, 48 us in
    first_batch = RankSpeed(samples=8, batches=1, seconds=48e-6, peak_memory_bytes=_MIB)
    tracker.take(0, first_batch)
    tracker.take(1, dataclasses.replace(first_batch, timed_steps=3, step_seconds=0.1))
    speed = tracker.speed()
    assert speed is not None and speed.samples == 16
    assert speed.samples_per_second is speed.steps_per_second is speed.mfu is None
    assert "/s" not in speed_line(speed)  # no samples/s, steps/s or tokens/s: shown as absent
    tracker.take(0, dataclasses.replace(first_batch, timed_steps=1, step_seconds=0.1))
    assert tracker.speed().samples_per_second == pytest.approx(16 / 48e-6)  # type: ignore[union-attr]


def test_gpu_memory_and_tokens_join_the_line() -> None:
    ranks = {
        0: RankSpeed(
            64,
            8,
            30_000,
            2.0,
            2**30,
            cuda_max_allocated=3 * 2**30,
            cuda_max_reserved=4 * 2**30,
            timed_steps=7,
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
    assert counter.counts(training) and not counter.counts(evaluation)  # the first iterated
    counter.count_loader_batch({"input_ids": torch.zeros(2, 3), "attention_mask": mask})
    first = counter.snapshot()
    assert (first.samples, first.batches, first.tokens) == (2, 1, 3)
    assert first.peak_memory_bytes is not None and first.peak_memory_bytes > 0
    counter.count_samples(7)
    counter.count_loader_batch((torch.zeros(9, 2), torch.zeros(9)))  # a pass under way: ignored
    assert not counter.counts(training)  # and no later pass counts
    assert (counter.snapshot().samples, counter.snapshot().batches) == (7, 1)
    assert batch_size(["a", "b", "c"]) == 3 and batch_size(torch.tensor(1.0)) == 1


def test_the_live_view_shows_the_speed_line_under_the_plot_and_in_the_summary(
    shown: list[dict[str, Any]],
) -> None:
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(LaunchInfo("Launching 2 processes", 2, 2, (0, 1), flag))
    assert observer.lines.get("speed") is None  # nothing counted yet: no line, no model
    speed = RankSpeed(32, 4, None, 2.0, 300 * _MIB, timed_steps=3, step_seconds=1.5)
    observer.on_metrics(_batch(0, speed))
    observer.on_tick()
    assert (
        observer.lines.get("speed") is not None
        and "16.0 samples/s" in observer.lines["speed"].value
    )
    children = list(observer.box.children)  # type: ignore[union-attr]
    assert children.index(observer.lines["speed"]) == children.index(observer.plot.widgets[-1]) + 1
    observer.on_finish(_SUMMARY)
    text = shown[1]["text/plain"].splitlines()
    assert (
        text[1]
        == "speed: 16.0 samples/s · 2.00 steps/s · step 500.0 ms · peak memory 300 MiB CPU on "
        "the largest rank"
    )
    assert 'class="nk-speed"' in shown[1]["text/html"]
    assert [line.get_text() for line in observer.figure.texts] == [text[1]]  # and in the PNG
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
    observer.on_metrics(_batch(0, memory_only, steps=0))
    observer.on_tick()
    observer.on_finish(_SUMMARY)
    assert observer.lines.get("speed") is None and "speed" not in shown[1]["text/plain"]
    flag.close()
    headless = HeadlessObserver()
    headless.on_metrics(MetricsBatch(0, (), speed=memory_only))
    headless.on_finish(_SUMMARY)
    assert "[speed]" not in capsys.readouterr().out


def _timed(steps: int, step: float, data: float, wait: float, **more: Any) -> RankSpeed:
    return RankSpeed(
        timed_steps=steps,
        step_seconds=steps * step,
        data_seconds=steps * data,
        wait_seconds=steps * wait,
        **more,
    )


def test_the_clock_splits_each_step_into_data_compute_and_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr("notebook_kit.runtime.step_clock.time.perf_counter", lambda: now[0])
    clock = StepClock()
    for _ in range(3):  # 2 s for the batch, then 5 s of backward ending in 1 s of all-reduce
        clock.asking()
        now[0] += 2.0
        clock.handed()
        now[0] += 4.0
        clock.gradients_computed()
        now[0] += 1.0
        clock.backward_returned()
    clock.asking()
    now[0] += 0.5
    clock.pass_ended()  # the loader ran out: the last step ends, with its 0.5 s of data
    # a step runs from one batch handed out to the next: 5 s of the one, the next one's data
    assert clock.steps == 3 and clock.step_seconds == pytest.approx(5 + 2 + 5 + 2 + 5 + 0.5)
    assert clock.data_seconds == pytest.approx(2 + 2 + 0.5)
    assert clock.wait_seconds == pytest.approx(3.0)
    clock.asking()
    now[0] += 1.0
    clock.handed()
    now[0] += 9.0
    clock.pass_ended(ran_out=False)  # a `break`: that step is not counted
    assert clock.steps == 3
    speed = RankSpeed(
        timed_steps=clock.steps,
        step_seconds=clock.step_seconds,
        data_seconds=clock.data_seconds,
        wait_seconds=clock.wait_seconds,
    )
    assert speed.data == pytest.approx(1.5) and speed.wait == pytest.approx(1.0)
    assert speed.compute == pytest.approx(19.5 / 3 - 2.5)


def test_a_straggler_lags_over_the_run_and_its_latest_window_and_is_drawn_with_its_cause() -> None:
    tracker = SpeedTracker()
    assert speed_line(tracker.speed()) == ""
    for steps in (5, 15, 25):  # rank 1 reads its data 20 ms slower; rank 0 waits for it
        tracker.take(0, _timed(steps, 0.05, 0.001, 0.021))
        tracker.take(1, _timed(steps, 0.05, 0.021, 0.001))
        tracker.take(2, _timed(steps, 0.05, 0.001, 0.020))
    speed = tracker.speed()
    assert speed is not None and (speed.straggler, speed.straggler_cause) == (1, "data")
    line = speed_line(speed)
    assert "step 50.0 ms = data 7.7 ms + compute 28.3 ms + wait 14.0 ms" in line, line
    assert line.endswith("straggler: rank 1 (data 21.0 ms)")
    # It catches up: over its latest 15 steps every rank reads in 1 ms and waits 10 ms.
    for rank, (data, wait) in enumerate([(0.025, 0.525), (0.525, 0.025), (0.025, 0.5)]):
        more = RankSpeed(timed_steps=40, step_seconds=2.0, data_seconds=data + 0.015)
        tracker.take(rank, dataclasses.replace(more, wait_seconds=wait + 0.15))
    assert _lagging(tracker.ranks) == (1, "data")  # still behind over the whole run
    assert tracker.speed().straggler is None  # type: ignore[union-attr]


def test_without_the_collective_wait_only_a_rank_slow_at_its_data_is_a_straggler() -> None:
    tracker = SpeedTracker()  # FSDP: the waits hide in the compute, every step looks alike
    tracker.take(0, RankSpeed(timed_steps=50, step_seconds=5.0, data_seconds=0.1))
    tracker.take(1, RankSpeed(timed_steps=50, step_seconds=5.0, data_seconds=3.0))
    speed = tracker.speed()
    assert speed is not None and (speed.straggler, speed.straggler_cause) == (1, "data")
    assert "step 100.0 ms = data 31.0 ms + compute 69.0 ms" in speed_line(speed)
    tracker.take(1, RankSpeed(timed_steps=60, step_seconds=6.0, data_seconds=0.3))
    assert tracker.speed().straggler is None  # type: ignore[union-attr]
    hand_written = SpeedTracker()  # no loader and no strategy: nothing to compare
    hand_written.take(0, RankSpeed(timed_steps=50, step_seconds=5.0))
    hand_written.take(1, RankSpeed(timed_steps=50, step_seconds=9.0))
    assert hand_written.speed().straggler is None  # type: ignore[union-attr]


def test_a_cluster_run_shows_a_line_per_node_and_the_stragglers_node() -> None:
    tracker = SpeedTracker()
    for rank in range(4):
        slow = rank == 3
        tracker.take(rank, _timed(30, 0.1, 0.0, 0.01 if slow else 0.05, peak_memory_bytes=_MIB))
    speed = tracker.speed()
    lines = speed_line(speed, {0: 0, 1: 0, 2: 1, 3: 1}).splitlines()
    assert " · straggler: rank 3 on node 1 (compute 90.0 ms) · " in lines[0], lines[0]
    assert lines[1:] == [
        "node 0 (ranks 0-1): step 100.0 ms = compute 50.0 ms + wait 50.0 ms"
        " · peak memory 1 MiB CPU on the largest rank",
        "node 1 (ranks 2-3): step 100.0 ms = compute 70.0 ms + wait 30.0 ms"
        " · peak memory 1 MiB CPU on the largest rank",
    ]


def test_mfu_is_the_model_flops_per_second_over_the_gpus_peak() -> None:
    peak = peak_flops("NVIDIA H100 80GB HBM3", "bf16")
    assert peak == 989e12 and peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert peak_flops("AMD Instinct MI300X", "bf16") == 1307e12
    assert peak_flops("cpu", "bf16") is None
    tracker = SpeedTracker()
    for rank in range(2):
        tracker.take(rank, RankSpeed(samples=8, batches=4, seconds=2.0, flops=0.4 * peak * 2.0,
                                     peak_flops=peak, timed_steps=3))  # fmt: skip
    speed = tracker.speed()
    assert speed is not None and speed.mfu == pytest.approx(0.4)
    assert "MFU 40.0%" in speed_line(speed)
    tracker.take(1, RankSpeed(8, 4, None, 2.0, flops=1.0, peak_flops=None, timed_steps=3))
    assert tracker.speed().mfu is None  # type: ignore[union-attr]  # a rank with no peak


def test_the_wait_begins_when_the_last_gradient_is_computed_before_ddps_own_callback() -> None:
    clock, seen = StepClock(), []
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))

    def gradient_ready(_: torch.Tensor) -> None:  # as DDP's reducer, at its last bucket
        torch.autograd.Variable._execution_engine.queue_callback(
            lambda: seen.append(("ddp waits", clock._ready is not None))
        )

    model[0].weight.register_hook(gradient_ready)  # the gradient computed last
    clock.time_backward(model(torch.ones(2, 3)).sum())
    assert seen == [("ddp waits", False)]  # no watched gradient: no wait is timed
    seen.clear()
    watch_gradients(model)
    watch_gradients(model)  # once per model
    assert len(model[1].bias._post_accumulate_grad_hooks) == 1
    clock.time_backward(model(torch.ones(2, 3)).sum())
    assert seen == [("ddp waits", True)]  # the clock's callback ran first
    assert clock._done is not None and clock._done >= clock._ready
    assert clock.sees_wait
    ready = clock._ready
    model(torch.ones(2, 3)).sum().backward()  # an untimed pass queues nothing
    assert clock._ready == ready


def test_the_published_flops_of_a_transformer_and_a_given_flops_per_sample() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=3, n_embd=48, n_head=4, vocab_size=100)
    model = transformers.GPT2LMHeadModel(config)
    flops = model_flops(model)
    assert flops is not None
    position_table = model.transformer.wpe.weight.numel()
    assert flops.params == sum(p.numel() for p in model.parameters()) - position_table
    assert flops.per_token(64) == 6 * flops.params + 12 * 3 * 48 * 64
    assert model_flops(torch.nn.Linear(3, 3)) is None
    counter = SpeedCounter()
    counter.flops_per_sample = 1e6
    counter.count_samples(4)
    assert counter.snapshot().flops == 4e6


def test_the_final_png_carries_the_speed_lines() -> None:
    figure = new_figure(1)
    draw_metrics(figure, {"loss": [(0, 1.0), (1, 0.5)]})
    plain = figure.get_size_inches()[1]
    draw_metrics(figure, {"loss": [(0, 1.0), (1, 0.5)]}, footer="speed: 1 samples/s\nnode 0")
    assert [text.get_text() for text in figure.texts] == ["speed: 1 samples/s\nnode 0"]
    assert figure.get_size_inches()[1] > plain


def test_the_view_of_a_cluster_run_adds_a_line_per_node(shown: list[dict[str, Any]]) -> None:
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(LaunchInfo("Launching 2 nodes", 1, 2, (0, 1), flag, rank_nodes=(0, 1)))
    for rank in (0, 1):
        observer.on_metrics(_batch(rank, _timed(12, 0.1, 0.01, 0.02)))
    observer.on_finish(_SUMMARY)
    text = shown[1]["text/plain"].splitlines()
    assert text[2:4] == [
        "node 0 (rank 0): step 100.0 ms = data 10.0 ms + compute 70.0 ms + wait 20.0 ms",
        "node 1 (rank 1): step 100.0 ms = data 10.0 ms + compute 70.0 ms + wait 20.0 ms",
    ], text
    flag.close()


def test_the_runtimes_collectives_in_a_step_are_its_wait_but_not_between_steps_or_elsewhere() -> (
    None
):
    context = LaunchContext(rank=0, world_size=2, send=lambda kind, payload: None)
    clock = step_clock(context)
    assert clock is not None
    clock.waited(5.0)  # loading a checkpoint, before any step: no step waits
    clock.step_ended()  # the first step begins
    time.sleep(0.02)  # compute
    with waiting_on_ranks(context):  # the Stop vote, the other rank still working
        time.sleep(0.01)
    background = threading.Thread(target=clock.waited, args=(5.0,))  # a background save agrees
    background.start()
    background.join()
    clock.step_ended()
    first = clock.wait_seconds
    assert clock.steps == 1 and first >= 0.01 and clock.step_seconds - first >= 0.02
    clock.waited(5.0)
    clock.pass_ended(ran_out=False)  # a break: the step cut short takes its wait with it
    clock.step_ended()
    clock.step_ended()
    assert clock.steps == 2 and clock.wait_seconds == first
