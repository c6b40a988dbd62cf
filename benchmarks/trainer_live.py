"""Trainer throughput: notebook_kit's launcher with the live view, with ``live=False``, and
Accelerate's ``notebook_launcher``, for the same Hugging Face ``Trainer`` run.

Two forked processes train a small BERT (random weights from a config) for a fixed number of
steps with ``logging_steps=10``; rank 0 measures steps per second between the Trainer's
``on_train_begin`` and ``on_train_end`` (process start-up and imports are not counted) and
writes it to a file, since Accelerate's launcher returns nothing. The three launches alternate,
each round starting with another, so background load hits all alike. Under notebook_kit the
Trainer needs no extra argument; Accelerate's launcher needs ``use_cpu=True`` on the CPU.
Targets: live view >= 0.98 x ``live=False``, and no slower than Accelerate's launcher.

Usage:
    python -m benchmarks.trainer_live [--steps 300] [--rounds 9] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from benchmarks._harness import free_port, rotated
from notebook_kit import notebook_launcher
from notebook_kit.live.notebook_view import LiveObserver

TOOLS = ("notebook_kit live", "notebook_kit live=False", "Accelerate notebook_launcher")


class _Tokens(Dataset):
    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 1000, (size, 32), generator=generator)
        self.labels = (self.ids[:, 0] >= 500).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


def _train(steps: int, out: str, use_cpu: bool) -> None:
    """One Trainer run; rank 0 writes its steps per second to ``out``."""
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    class Clock(TrainerCallback):
        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            self.started = time.perf_counter()

        def on_train_end(self, args: Any, state: Any, *rest: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero:
                rate = state.global_step / (time.perf_counter() - self.started)
                Path(out).write_text(json.dumps({"steps_per_second": rate}))

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=32, num_labels=2,
    )  # fmt: skip
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="trainer-bench-"), max_steps=steps,
        per_device_train_batch_size=8, logging_steps=10, save_strategy="no", report_to="none",
        disable_tqdm=True, use_cpu=use_cpu, ddp_find_unused_parameters=False,
    )  # fmt: skip
    trainer = Trainer(
        model=BertForSequenceClassification(config),
        args=arguments,
        train_dataset=_Tokens(8 * 2 * steps),
        callbacks=[Clock()],
    )
    trainer.train()


def _ours(live: bool) -> Callable[[int, str], None]:
    def launch(steps: int, out: str) -> None:
        options: dict[str, Any] = {"observer": LiveObserver()} if live else {"live": False}
        notebook_launcher(_train, args=(steps, out, False), num_processes=2, **options)

    return launch


def _accelerate(steps: int, out: str) -> None:
    from accelerate import notebook_launcher as accelerate_launcher

    # Its default port, 29500, may be taken by another job on a shared machine.
    accelerate_launcher(_train, args=(steps, out, True), num_processes=2, use_port=str(free_port()))


def measure(steps: int, rounds: int) -> dict[str, list[float]]:
    """Steps per second of each launch, ``rounds`` times, interleaved."""
    launches = dict(zip(TOOLS, (_ours(True), _ours(False), _accelerate), strict=True))
    rates: dict[str, list[float]] = {tool: [] for tool in TOOLS}
    with tempfile.TemporaryDirectory() as folder:
        for round_index in range(rounds):
            for tool in rotated(TOOLS, round_index):
                out = os.path.join(folder, f"{round_index}-{len(rates[tool])}.json")
                # Widget reprs (no front end here) and Accelerate's worker output.
                with contextlib.redirect_stdout(io.StringIO()):
                    launches[tool](steps, out)
                rates[tool].append(json.loads(Path(out).read_text())["steps_per_second"])
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, help="also write the rates as JSON")
    options = parser.parse_args()
    rates = measure(options.steps, options.rounds)
    medians = {tool: statistics.median(values) for tool, values in rates.items()}
    for tool, values in rates.items():
        spread = f"{min(values):.1f}-{max(values):.1f}"
        print(f"{tool:>30}: {medians[tool]:6.1f} steps/s (median of {len(values)}, {spread})")
    live, quiet, accelerate = (medians[tool] for tool in TOOLS)
    print(f"live / live=False: {live / quiet:.3f} (target >= 0.98)")
    print(f"live / Accelerate notebook_launcher: {live / accelerate:.3f} (target >= 1.0)")
    if options.out:
        options.out.write_text(json.dumps({"rates": rates, "medians": medians}, indent=2))


if __name__ == "__main__":
    main()
