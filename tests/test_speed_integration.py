"""Real launches: samples, steps and tokens counted, memory peaks read, and the speed line."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import notebook_kit
from notebook_kit import Accelerator, ProjectConfiguration, last_run, notebook_launcher
from notebook_kit.live.speed import speed_line
from notebook_kit.runtime.context import current_launch

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]

_SAMPLES, _BATCH, _EPOCHS = 96, 8, 2
_LENGTH = 8  # tokens per padded sequence


def _prepared_loop() -> None:
    """Two epochs over a prepared loader, with an evaluation pass that must not count."""
    accelerator = Accelerator()
    data = TensorDataset(torch.randn(_SAMPLES, 3), torch.randn(_SAMPLES))
    loader = accelerator.prepare(DataLoader(data, batch_size=_BATCH))
    evaluation = accelerator.prepare(DataLoader(data, batch_size=_BATCH))
    for _ in range(_EPOCHS):
        for inputs, _targets in loader:
            inputs.sum()
        for _ in evaluation:
            pass


def test_a_prepared_loader_counts_every_sample_of_every_rank_with_no_user_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    notebook_launcher(_prepared_loop, num_processes=2)
    record = last_run()
    speed = record.speed
    assert speed is not None
    assert speed.samples == _SAMPLES * _EPOCHS  # each rank half the data, evaluation not counted
    assert speed.steps == _SAMPLES // (2 * _BATCH) * _EPOCHS
    assert {rank: ranked.samples for rank, ranked in speed.ranks.items()} == {
        0: _SAMPLES * _EPOCHS // 2,
        1: _SAMPLES * _EPOCHS // 2,
    }
    assert 0 < speed.seconds <= record.duration
    assert speed.samples_per_second == pytest.approx(speed.samples / speed.seconds)
    assert speed.steps_per_second == pytest.approx(speed.steps / speed.seconds)
    assert speed.tokens is None and speed.tokens_per_second is None
    printed = capsys.readouterr().out
    assert "[speed] " in printed and " samples/s · " in printed, printed


class _Padded(Dataset):
    """Sequences of 1 to 8 real tokens, padded to 8: the mask says which are real."""

    def __len__(self) -> int:
        return _SAMPLES

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        real = index % _LENGTH + 1
        mask = torch.zeros(_LENGTH, dtype=torch.long)
        mask[:real] = 1
        return {"input_ids": torch.arange(_LENGTH) * mask, "attention_mask": mask}


def _token_loop() -> None:
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(_Padded(), batch_size=_BATCH))
    for batch in loader:
        batch["input_ids"].sum()


def test_tokens_are_the_non_padding_tokens_of_the_attention_mask() -> None:
    notebook_launcher(_token_loop, num_processes=2)
    speed = last_run().speed
    assert speed is not None
    real = sum(index % _LENGTH + 1 for index in range(_SAMPLES))
    assert speed.tokens == real < _SAMPLES * _LENGTH
    assert speed.samples == _SAMPLES
    assert speed.tokens_per_second == pytest.approx(real / speed.seconds)
    assert "tokens/s" in speed_line(speed)


def _hand_written(steps: int) -> None:
    notebook_kit.set_flops_per_sample(1000.0)
    for step in range(steps):
        notebook_kit.log({"loss": 1.0 / (step + 1)}, step=step, samples=4 + current_launch().rank)


def test_a_hand_written_loop_counts_the_samples_given_to_log() -> None:
    notebook_launcher(_hand_written, args=(10,), num_processes=2)
    speed = last_run().speed
    assert speed is not None
    assert {rank: ranked.samples for rank, ranked in speed.ranks.items()} == {0: 40, 1: 50}
    assert speed.samples == 90 and speed.steps == 10
    assert {rank: ranked.flops for rank, ranked in speed.ranks.items()} == {0: 40e3, 1: 50e3}
    assert all(ranked.timed_steps == 9 for ranked in speed.ranks.values())  # between log calls
    assert speed.samples_per_second == pytest.approx(90 / speed.seconds)
    assert last_run().metrics["loss"][-1] == (9, pytest.approx(0.1))  # metrics keep their names
    assert set(last_run().metrics) == {"loss"}


_BIG = 400 * 2**20


def _allocating() -> None:
    kept: Any = None
    if current_launch().rank == 1:
        kept = torch.ones(_BIG // 4)  # written, so resident
    notebook_kit.log({"loss": float(kept is None)})


def test_the_peak_resident_memory_of_each_rank_shows_a_big_allocation() -> None:
    notebook_launcher(_allocating, num_processes=2)
    speed = last_run().speed
    assert speed is not None
    peaks = speed.peak_memory_bytes
    assert peaks[0] is not None and peaks[0] > 0
    assert peaks[1] is not None and peaks[1] >= _BIG
    assert peaks[1] - peaks[0] >= 0.9 * _BIG
    assert speed.ranks[0].cuda_max_allocated is None  # a CPU run has no GPU figures
    assert "peak memory" in speed_line(speed) and "samples/s" not in speed_line(speed)


def _done_at_once() -> None:
    """A resumed run with nothing left to do: it breaks out at its first batch."""
    accelerator = Accelerator()
    data = TensorDataset(torch.randn(_SAMPLES, 3))
    for _ in accelerator.prepare(DataLoader(data, batch_size=_BATCH)):
        break


def test_a_run_that_times_no_step_shows_no_rate() -> None:
    notebook_launcher(_done_at_once, num_processes=2)
    speed = last_run().speed
    assert speed is not None and speed.samples == 2 * _BATCH  # counted, over microseconds
    assert all(ranked.timed_steps == 0 for ranked in speed.ranks.values())
    assert speed.samples_per_second is None and speed.steps_per_second is None
    assert "/s" not in speed_line(speed)


def _silent() -> int:
    return 1


def test_a_run_that_logs_nothing_and_has_no_loader_shows_nothing_new(
    capsys: pytest.CaptureFixture[str],
) -> None:
    notebook_launcher(_silent, num_processes=2)
    assert last_run().speed is None
    assert "[speed]" not in capsys.readouterr().out


def test_samples_must_be_a_count() -> None:
    with pytest.raises(TypeError, match=r"log\(samples=\.\.\.\) must be a non-negative int"):
        notebook_kit.log({"loss": 1.0}, samples=-1)
    with pytest.raises(TypeError, match="batch size"):
        notebook_kit.log({"loss": 1.0}, samples=2.5)  # type: ignore[arg-type]


class _Features(Dataset):
    """Random features; reading one sleeps ``delay`` seconds (a slow disk or decoder)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __len__(self) -> int:
        return 480

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return torch.randn(32)


def _one_rank_slower(where: str) -> None:
    """DDP over a prepared loader; rank 1 is slower in its data loader or in its compute."""
    accelerator = Accelerator()
    slow = accelerator.process_index == 1
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Linear(128, 32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = _Features(0.002 if slow and where == "data" else 0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, 8))
    for inputs in loader:
        if slow and where == "compute":
            time.sleep(0.015)  # work the other ranks do not have
        accelerator.backward(model(inputs).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("where", ["data", "compute"])
def test_a_slower_rank_is_named_as_the_straggler_with_its_cause(where: str) -> None:
    notebook_launcher(_one_rank_slower, args=(where,), num_processes=2)
    speed = last_run().speed
    assert speed is not None
    fast, slow = speed.ranks[0], speed.ranks[1]
    assert fast.timed_steps == slow.timed_steps == 30  # 480 samples, 8 a batch, 2 ranks
    for ranked in (fast, slow):  # the three parts make up the step
        assert ranked.data is not None and ranked.wait is not None and ranked.compute is not None
        assert ranked.data + ranked.compute + ranked.wait == pytest.approx(ranked.step)
    lost = 8 * 0.002 if where == "data" else 0.015  # seconds a step the slow rank loses
    assert getattr(slow, where) - getattr(fast, where) >= 0.8 * lost
    assert fast.wait - slow.wait >= 0.5 * lost  # the fast rank waits for the slow one
    assert (speed.straggler, speed.straggler_cause) == (1, where)
    line = speed_line(speed)
    assert f"straggler: rank 1 ({where} " in line and " = data " in line, line


def _resumable_loop(project_dir: Path, every: str) -> None:
    """The documented loop that starts and resumes: a checkpoint every 5 steps and the Stop
    vote at every step (or a checkpoint at every step and no vote). Every rank works 60 ms a
    step (a realistic step: the vote then runs at each call); rank 1 works 40 ms more, after
    its step, outside any collective: rank 0 waits for it in the next one the runtime makes."""
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir, total_limit=1))
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(320, 8), torch.randn(320, 1))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, 8))
    accelerator.load_state()
    for step, (inputs, targets) in enumerate(loader, start=1):
        time.sleep(0.06)
        accelerator.backward(torch.nn.functional.mse_loss(model(inputs), targets))
        optimizer.step()
        optimizer.zero_grad()
        if accelerator.process_index == 1:
            time.sleep(0.04)
        if step % (1 if every == "checkpoint" else 5) == 0:
            accelerator.save_state()
        if every == "vote" and accelerator.should_stop:
            break


@pytest.mark.parametrize("every", ["vote", "checkpoint"])
def test_the_straggler_is_named_in_the_resumable_loop_its_votes_and_checkpoints_timed_as_waiting(
    tmp_path: Path, every: str
) -> None:
    notebook_launcher(_resumable_loop, args=(tmp_path, every), num_processes=2)
    speed = last_run().speed
    assert speed is not None
    fast, slow = speed.ranks[0], speed.ranks[1]
    assert fast.timed_steps == slow.timed_steps == 20  # 320 samples, 8 a batch, 2 ranks
    assert fast.wait is not None and slow.wait is not None
    # Rank 0 waits for rank 1 in the vote or in save_state's agreement, not in backward.
    assert fast.wait >= 0.5 * 0.04
    if every == "vote":
        assert fast.wait - slow.wait >= 0.5 * 0.04
        assert (speed.straggler, speed.straggler_cause) == (1, "compute")
    # (Saving at every step, rank 0 writes while rank 1 waits: neither holds the other back.)


def _balanced() -> None:
    _one_rank_slower("nowhere")


def test_ranks_doing_the_same_work_name_no_straggler() -> None:
    notebook_launcher(_balanced, num_processes=2)
    speed = last_run().speed
    assert speed is not None and speed.ranks[0].wait is not None
    assert speed.straggler is None and "straggler" not in speed_line(speed)


def _tiny_gpt2() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    accelerator = Accelerator()
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    model = accelerator.prepare(GPT2LMHeadModel(config))
    ids = torch.randint(0, 64, (12, 16))
    loader = accelerator.prepare(DataLoader([{"input_ids": row} for row in ids], batch_size=4))
    for batch in loader:
        accelerator.backward(model(**batch, labels=batch["input_ids"]).loss)


def test_a_transformers_model_counts_its_flops_and_a_cpu_run_shows_no_mfu() -> None:
    pytest.importorskip("transformers")
    notebook_launcher(_tiny_gpt2, num_processes=1, isolate=True)
    speed = last_run().speed
    assert speed is not None
    ranked = speed.ranks[0]
    # nanoGPT's count: every weight but the position table (wte is also the output layer)
    params = 64 * 32 + 2 * (4 * 32 + 32 * 96 + 96 + 32 * 32 + 32 + 32 * 128 + 128 + 128 * 32 + 32)
    params += 2 * 32
    per_token = 6 * params + 12 * 2 * 32 * 16
    assert ranked.flops == 12 * 16 * per_token
    assert ranked.peak_flops is None and speed.mfu is None  # no GPU: no peak, no MFU
    assert "MFU" not in speed_line(speed)
