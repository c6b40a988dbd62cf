"""The training functions of the ladder's rungs, shared by the tests that launch them.

Imported by the test modules and by the Jupyter kernels those tests start (which is why they
live in a module: a kernel cannot import a test module's fixtures). Every function may be
stopped from the kernel and reports the step each rank ended on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

import notebook_kit

__all__ = [
    "Tokens",
    "accelerate_loop",
    "accelerator_loop",
    "gathered",
    "raw_ddp",
    "tiny_bert",
    "train_with_trainer",
    "training_arguments",
]


def gathered(value: Any) -> list[Any]:
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def raw_ddp(steps: int, pause: float = 0.0) -> list[dict[str, Any]]:
    """A hand-written DDP loop using only notebook_kit.log / should_stop / progress."""
    generator = torch.Generator().manual_seed(dist.get_rank())
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    notebook_kit.progress(total=steps)
    logged, step = [], 0
    for step in range(steps):
        inputs = torch.randn(16, 4, generator=generator)
        loss = nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        notebook_kit.log({"loss": loss.detach()}, step=step)  # a tensor: read off the loop
        logged.append((step, loss.item()))
        time.sleep(pause)
        if notebook_kit.should_stop():
            break
    return gathered({"logged": logged, "last_step": step})


def accelerator_loop(steps: int, pause: float = 0.0, **options: Any) -> dict[str, Any]:
    """notebook_kit's own Accelerator; ``options`` go to it (e.g. ``log_with``)."""
    accelerator = notebook_kit.Accelerator(**options)
    accelerator.init_trackers("ladder", config={"lr": 0.05, "steps": steps})
    model = nn.Linear(4, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    generator = torch.Generator().manual_seed(accelerator.process_index)
    accelerator.progress(total=steps)
    logged, step = [], 0
    for step in range(steps):
        inputs = torch.randn(16, 4, generator=generator)
        loss = nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"loss": loss.item()}, step=step)
        logged.append((step, loss.item()))
        time.sleep(pause)
        if accelerator.should_stop:
            break
    accelerator.end_training()
    return {"logged": logged, "last_steps": gathered(step)}


def accelerate_loop(model: nn.Module, steps: int, pause: float = 0.0) -> dict[str, Any]:
    from accelerate import Accelerator

    from notebook_kit.integrations import LiveViewTracker

    accelerator = Accelerator(log_with=LiveViewTracker())  # no cpu=True
    accelerator.init_trackers("ladder", config={"lr": 0.05})
    prepared, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    generator = torch.Generator().manual_seed(accelerator.process_index)
    notebook_kit.progress(total=steps)  # Accelerate's Accelerator has no bar of its own
    logged, step = [], 0
    for step in range(steps):
        inputs = torch.randn(16, 4, generator=generator)
        loss = nn.functional.mse_loss(prepared(inputs), inputs.sum(dim=1, keepdim=True))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"loss": loss.item(), "lr": 0.05}, step=step)
        logged.append((step, loss.item()))
        time.sleep(pause)
        if notebook_kit.should_stop():
            break
    accelerator.end_training()
    return {
        "num_processes": accelerator.num_processes,
        "device": accelerator.device.type,
        "logged": logged,
        "last_steps": gathered(step),
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
    }


class Tokens(Dataset):
    """Token sequences whose label is whether the first token is in the upper half."""

    def __init__(self, size: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 32, (size, 8), generator=generator)
        self.labels = (self.ids[:, 0] >= 16).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


def tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=2,
    )  # fmt: skip
    return BertForSequenceClassification(config)  # random weights: nothing is downloaded


def training_arguments(output_dir: Path, **overrides: Any) -> Any:
    from transformers import TrainingArguments

    settings: dict[str, Any] = {
        "output_dir": str(output_dir), "per_device_train_batch_size": 4, "num_train_epochs": 2,
        "logging_steps": 2, "eval_strategy": "epoch", "report_to": "none",
        "save_strategy": "no", "learning_rate": 1e-3, "seed": 0,
    }  # fmt: skip
    return TrainingArguments(**{**settings, **overrides})


def train_with_trainer(
    model: nn.Module, output_dir: Path, arguments: Any = None, pause: float = 0.0, epochs: int = 2
) -> dict[str, Any]:
    from transformers import Trainer, TrainerCallback

    class Slow(TrainerCallback):  # lets a test click Stop mid-run
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(pause)

    arguments = arguments or training_arguments(output_dir, num_train_epochs=epochs)
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=Tokens(64),
        eval_dataset=Tokens(16, seed=1),
        callbacks=[Slow()],
    )
    output = trainer.train()
    return {
        "world_size": arguments.world_size,
        "global_steps": gathered(output.global_step),
        "log_history": trainer.state.log_history,
        "callbacks": [type(callback).__name__ for callback in trainer.callback_handler.callbacks],
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
    }
