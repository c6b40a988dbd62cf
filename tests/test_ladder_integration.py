"""Each rung of the ladder on two forked workers: raw DDP, Accelerate's Accelerator, the Trainer.

What the workers logged must be what ``last_run()`` holds, every rung must see the launch's
world size without being told, and trained weights must come home to the kernel's model.
Stopping each rung through the Stop button is in ``test_ladder_stop_integration.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import notebook_kit
from notebook_kit import last_run, notebook_launcher
from tests.ladder_rungs import (
    accelerate_loop,
    accelerator_loop,
    raw_ddp,
    tiny_bert,
    train_with_trainer,
    training_arguments,
)
from tests.optional import needs_accelerate, needs_transformers

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


def same_history(actual: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """Same steps, values equal up to float rounding."""
    steps = [step for step, _ in actual] == [step for step, _ in expected]
    return steps and [v for _, v in actual] == pytest.approx([v for _, v in expected])


def _mean_by_step(ranks: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    by_step: dict[int, list[float]] = {}
    for logged in ranks:
        for step, value in logged:
            by_step.setdefault(step, []).append(value)
    return [(step, sum(values) / len(values)) for step, values in sorted(by_step.items())]


# -- rung 1: torch.distributed and DistributedDataParallel, no Accelerator ---------------------


def test_raw_ddp_loop_gets_metrics_progress_and_a_normal_return() -> None:
    ranks = notebook_launcher(raw_ddp, args=(40,), num_processes=2, live=False)
    record = last_run()
    assert record is not None and record.succeeded and not record.stopped
    assert same_history(record.metrics["loss"], _mean_by_step([r["logged"] for r in ranks]))
    assert same_history(record.rank_metrics[1]["loss"], ranks[1]["logged"])
    assert record.steps == 40  # each should_stop() call counted one step


def test_module_level_calls_outside_a_launch_do_nothing() -> None:
    notebook_kit.log({"loss": 1.0}, step=0)
    notebook_kit.progress(10)
    assert notebook_kit.should_stop() is False


# -- rung 2: notebook_kit's Accelerator, and Hugging Face Accelerate's own ----------------------


def test_accelerator_writes_tensorboard_next_to_the_live_plot(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    options = {"log_with": "tensorboard", "project_dir": str(tmp_path)}
    result = notebook_launcher(
        accelerator_loop, args=(10,), kwargs=options, num_processes=2, live=False
    )
    record = last_run()
    assert record is not None and record.succeeded and record.steps == 10
    assert same_history(record.rank_metrics[0]["loss"], result["logged"])
    events = EventAccumulator(str(tmp_path / "ladder"))  # project_dir/project_name
    events.Reload()
    written = [(event.step, event.value) for event in events.Scalars("loss")]
    assert same_history(written, result["logged"])  # rank 0 writes, as in Accelerate
    assert len(list((tmp_path / "ladder").glob("events.out.tfevents.*"))) >= 1


@needs_accelerate
def test_accelerate_accelerator_joins_the_launch_logs_live_and_sends_weights_home() -> None:
    from accelerate.state import PartialState

    PartialState()  # a state made in the kernel before the launch: one process, must not leak
    model = nn.Linear(4, 1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        result = notebook_launcher(accelerate_loop, args=(model, 12), num_processes=2, live=False)
    finally:
        PartialState._reset_state()
    assert result["num_processes"] == 2 and result["device"] == "cpu"
    record = last_run()
    assert record is not None and record.succeeded
    # Accelerate logs on the main process only: the plot shows rank 0's values.
    assert same_history(record.metrics["loss"], result["logged"])
    assert set(record.rank_metrics) == {0}
    assert record.steps == 12  # the logged step moves the bar
    for name, value in model.state_dict().items():
        assert torch.equal(value, result["weights"][name])
        assert not torch.equal(value, before[name])


# -- rung 3: the Transformers Trainer ----------------------------------------------------------


@needs_transformers
def test_trainer_trains_as_one_job_and_streams_its_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = notebook_launcher(train_with_trainer, args=(model, tmp_path), num_processes=2)
    printed = capsys.readouterr()
    # 64 samples, 4 per device, 2 ranks, 2 epochs: 16 steps (32 if each rank trained alone).
    assert result["world_size"] == 2 and result["global_steps"] == [16, 16]
    assert "LiveViewCallback" in result["callbacks"]
    assert "ProgressCallback" not in result["callbacks"]
    record = last_run()
    assert record is not None and record.succeeded and record.steps == 16
    history = result["log_history"]
    for name in ("loss", "learning_rate", "grad_norm", "epoch", "eval_loss"):
        # One value per step (``epoch`` comes with both the training and the eval log).
        by_step = {entry["step"]: entry[name] for entry in history if name in entry}
        expected = sorted(by_step.items())
        assert expected and same_history(record.rank_metrics[0][name], expected), name
    assert "train_runtime" in history[-1] and "train_runtime" not in record.metrics
    # The Trainer's tqdm bar, its printed log dicts and the pinned-memory warning stay out.
    output = printed.out + printed.err
    assert "it/s]" not in output and "{'loss'" not in output and "pin_memory" not in output
    # The kernel's model object now holds rank 0's trained weights.
    for name, value in model.state_dict().items():
        assert torch.equal(value, result["weights"][name]), name
    assert any(not torch.equal(model.state_dict()[k], before[k]) for k in before)


@needs_transformers
def test_trainer_arguments_made_in_the_kernel_still_see_the_launch(tmp_path: Path) -> None:
    arguments = training_arguments(tmp_path, num_train_epochs=1)  # device set up here, alone
    assert arguments.world_size == 1
    result = notebook_launcher(
        train_with_trainer, args=(tiny_bert(), tmp_path, arguments), num_processes=2, live=False
    )
    assert result["world_size"] == 2 and result["global_steps"] == [8, 8]
