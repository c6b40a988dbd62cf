"""Real launches with two forked workers and the text displays (no notebook front end)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch.distributed as dist

from notebook_kit import last_run, notebook_launcher
from notebook_kit.live.headless import HeadlessObserver
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.metrics import close_channel, log_from_worker
from notebook_kit.runtime.progress import advance, report_total
from notebook_kit.runtime.stopping import should_stop

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


def _train(steps: int, pause: float = 0.0) -> dict[str, Any]:
    """Log a rank-dependent loss every step and a validation value every 10; may be stopped."""
    launch = current_launch()
    report_total(launch, steps)
    logged: list[tuple[str, int, float]] = []
    step = 0
    for step in range(steps):
        loss = 1.0 / (step + 1) + launch.rank
        log_from_worker(launch, {"loss": loss}, step=step)
        logged.append(("loss", step, loss))
        if step % 10 == 9:
            log_from_worker(launch, {"val_loss": float(launch.rank)}, step=step)
            logged.append(("val_loss", step, float(launch.rank)))
        advance(launch)
        time.sleep(pause)
        if should_stop(launch):
            print(f"stopping at step {step}", flush=True)
            break
    close_channel(launch)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {"logged": logged, "last_step": step})
    return {"ranks": everyone}


def _means(ranks: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    by_name: dict[str, dict[int, list[float]]] = {}
    for rank in ranks:
        for name, step, value in rank["logged"]:
            by_name.setdefault(name, {}).setdefault(step, []).append(value)
    return {
        name: [(step, sum(values) / len(values)) for step, values in sorted(by_step.items())]
        for name, by_step in by_name.items()
    }


def test_headless_run_prints_progress_lines_and_records_every_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = notebook_launcher(_train, args=(300,), num_processes=2)
    printed = capsys.readouterr().out
    assert "[finished] step 300/300 (100%)" in printed
    assert "loss 0.5033" in printed  # the mean over ranks of the last value
    record = last_run()
    assert record is not None and record.metrics == _means(result["ranks"])
    assert record.rank_metrics[1]["val_loss"][0] == (9, 1.0)
    assert record.exit_codes == {0: 0, 1: 0} and not record.stopped
    assert record.steps == 300 and record.dropped == 0


def test_quiet_run_prints_nothing_and_still_records(capsys: pytest.CaptureFixture[str]) -> None:
    def noisy() -> None:
        print("training output", flush=True)
        log_from_worker(current_launch(), {"loss": 1.0}, step=0)
        close_channel(current_launch())

    notebook_launcher(noisy, num_processes=2, live=False)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    record = last_run()
    assert record is not None and record.metrics == {"loss": [(0, 1.0)]}


class _StopAfterMetrics(HeadlessObserver):
    """Presses Stop (sets the flag from the kernel) once some metrics arrived."""

    def on_start(self, info: Any) -> None:
        super().on_start(info)
        self.flag = info.stop_flag

    def on_tick(self) -> None:
        super().on_tick()
        if self.recorder.progress.count >= 20:
            self.flag.set()


def test_stop_ends_every_rank_at_the_same_step_with_a_normal_return(
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    result = notebook_launcher(
        _train, args=(100_000, 0.005), num_processes=2, observer=_StopAfterMetrics()
    )
    assert time.monotonic() - started < 30
    last_steps = {rank["last_step"] for rank in result["ranks"]}
    assert len(last_steps) == 1 and last_steps.pop() < 100_000 - 1
    record = last_run()
    assert record is not None and record.stopped and record.succeeded
    printed = capsys.readouterr().out
    assert "[rank 0] stopping at step" in printed and "[rank 1] stopping at step" in printed
    assert "[stopped]" in printed
