"""What the workers run: the same bodies for every tool, so only the launcher differs.

A tool hands each worker a ``Backend`` (its rank and its way to wrap a model and run
backward); ``run_task`` then does the measured work and reports through the run folder.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch import nn

from benchmarks._harness import report

TaskKind = Literal["allreduce", "fail", "memory", "train", "hang", "first_step"]

# The raising rank's message; the caller checks that the exception it gets shows it.
FAILURE_MARKER = "benchmark failure raised on rank 1"
FAILING_RANK = 1
# Rank 1 raises this long after rank 0 entered the barrier, as in a real crash mid-training.
_FAIL_DELAY_SECONDS = 0.2
# A memory worker waits at most this long for the caller to finish measuring it.
_RELEASE_TIMEOUT_SECONDS = 120.0


@dataclass
class Task:
    """One unit of work for both workers of a run (picklable, for spawn)."""

    kind: TaskKind
    run_dir: str
    data: torch.Tensor | None = None  # the caller's dataset (memory task)
    warmup: int = 5
    steps: int = 30
    batch: int = 32  # per process


class Backend(Protocol):
    """What a tool gives a worker."""

    rank: int
    world_size: int

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        """Wrap model and optimizer for data-parallel training."""

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` the tool's way."""


class SmallCNN(nn.Module):
    """Two convolutions and a linear layer on 28×28 single-channel images (MNIST-sized)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * 5 * 5, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).flatten(1))


def run_task(task: Task, backend: Backend) -> None:
    """Run ``task`` on this worker (the body each tool's launched function calls)."""
    report(task.run_dir, f"pid-{backend.rank}", os.getpid())
    _BODIES[task.kind](task, backend)


def _all_reduce(task: Task, backend: Backend) -> None:
    value = torch.ones(1)
    dist.all_reduce(value)


def _fail(task: Task, backend: Backend) -> None:
    """Rank 1 raises while rank 0 is blocked in a collective."""
    if backend.rank != FAILING_RANK:
        dist.barrier()
        return
    time.sleep(_FAIL_DELAY_SECONDS)
    report(task.run_dir, "raised-at", time.monotonic())
    raise ValueError(FAILURE_MARKER)


def _read_shard(task: Task, backend: Backend) -> None:
    """Read this rank's half of the caller's dataset, then wait while the caller measures."""
    if task.data is None:
        raise ValueError("the memory task needs the caller's dataset (Task.data)")
    report(task.run_dir, f"threads-{backend.rank}", torch.get_num_threads())
    shard = task.data.view(backend.world_size, -1)[backend.rank]
    report(task.run_dir, f"sum-{backend.rank}", float(shard.sum()))
    report(task.run_dir, f"ready-{backend.rank}", True)
    release = os.path.join(task.run_dir, "release")
    deadline = time.monotonic() + _RELEASE_TIMEOUT_SECONDS
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.005)


def train_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    backward: Any,
    batch: int,
    warmup: int,
    steps: int,
) -> list[float]:
    """Seconds per training step (forward, backward, optimizer step) after ``warmup`` steps."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (batch,), generator=generator)
    times = []
    for step in range(warmup + steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        backward(loss)
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - started)
    return times


def _train(task: Task, backend: Backend) -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = backend.prepare(model, optimizer)
    times = train_steps(model, optimizer, backend.backward, task.batch, task.warmup, task.steps)
    report(
        task.run_dir,
        f"train-{backend.rank}",
        {"step_times": times, "threads": torch.get_num_threads(), "batch": task.batch},
    )


def _first_step(task: Task, backend: Backend) -> None:
    """Build, wrap and take one optimizer step; report when it was done (wall clock)."""
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = backend.prepare(model, optimizer)
    images, labels = torch.randn(task.batch, 1, 28, 28), torch.randint(0, 10, (task.batch,))
    backend.backward(nn.functional.cross_entropy(model(images), labels))
    optimizer.step()
    report(task.run_dir, f"stepped-{backend.rank}", time.time())


def _hang(task: Task, backend: Backend) -> None:
    """Keep running until stopped from outside (the interrupt measurement)."""
    report(task.run_dir, f"running-{backend.rank}", True)
    while True:
        time.sleep(0.01)


_BODIES = {
    "allreduce": _all_reduce,
    "fail": _fail,
    "memory": _read_shard,
    "train": _train,
    "hang": _hang,
    "first_step": _first_step,
}
