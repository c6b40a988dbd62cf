"""``notebook_kit.profile(steps=3)`` from another thread while a 2-rank launch trains.

The function has no profiling code: a prepared loader, ``accelerator.backward`` and a logged
loss per step. Each rank starts torch's profiler at its next step, stops after three, and
writes its own Chrome trace; the caller gets every rank's top operators, and
``last_run().profile`` keeps them. Bad arguments are refused before anything is asked.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import notebook_kit
from notebook_kit import notebook_launcher
from notebook_kit.accelerator import Accelerator

pytestmark = pytest.mark.integration


def _batches(loader: Any, prepared: bool) -> Any:
    """The prepared loader's batches, or the same data sliced by hand: then no loader and no
    ``log(samples=...)`` marks a step, and each backward pass does."""
    if prepared:
        yield from loader
        return
    inputs, targets = torch.randn(64, 16), torch.randn(64, 4)
    for start in range(0, 64, 4):
        yield inputs[start : start + 4], targets[start : start + 4]


def _train(done: Any, prepared: bool) -> int:
    """Steps until the test has its profile (every rank stops at the same step)."""
    accelerator = Accelerator()
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps = 0
    for _ in range(500):
        for inputs, targets in _batches(loader, prepared):
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.log({"loss": loss.item()}, step=steps)
            steps += 1
            time.sleep(0.01)
        finished = torch.tensor(float(done.is_set()))
        torch.distributed.all_reduce(finished)
        if finished.item():
            return steps
    return steps


def _profile_when_running(found: dict[str, Any], done: Any, folder: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            found["profile"] = notebook_kit.profile(steps=3, timeout=30, folder=folder)
            break
        except TimeoutError as error:  # a rank never profiled its steps: the test fails
            found["error"] = error
            break
        except RuntimeError as error:  # the run has not started yet
            found["error"] = error
            time.sleep(0.1)
    done.set()


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared_loader", "backward_only"])
def test_profile_three_steps_mid_run_writes_each_ranks_trace_and_table(
    tmp_path: Path, prepared: bool
) -> None:
    done = multiprocessing.get_context("fork").Event()
    found: dict[str, Any] = {}
    asker = threading.Thread(target=_profile_when_running, args=(found, done, tmp_path))
    asker.start()
    notebook_launcher(_train, args=(done, prepared), num_processes=2, live=False)
    asker.join(10)
    results = found.get("profile")
    assert results is not None, found
    assert sorted(results) == [0, 1]
    for rank, result in results.items():
        assert result.trace == tmp_path / f"profile_{rank}.json" and result.steps == 3
        names = {e.get("name") for e in json.loads(result.trace.read_text())["traceEvents"]}
        assert {"ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"} <= names, rank
        assert "ProfilerStep#3" not in names  # three steps, no more
        assert any("addmm" in str(name) or "linear" in str(name) for name in names)
        assert len(result.table) == 10 and all(row[1] >= 1 for row in result.table)
        assert len(result.step_spans) == 3 and result.spans
        assert f"rank {rank} · 3 steps" in str(results)
    record = notebook_kit.last_run()
    assert record is not None and record.profile == results


@pytest.mark.parametrize(
    ("steps", "error"),
    [(0, ValueError), (-2, ValueError), (2.5, TypeError), ("5", TypeError), (True, TypeError)],
)
def test_bad_steps_are_refused_naming_steps_before_anything_is_asked(steps, error) -> None:
    with pytest.raises(error, match=r"profile\(steps=.*steps must"):
        notebook_kit.profile(steps=steps)


def test_without_a_run_in_progress_profile_says_so() -> None:
    with pytest.raises(RuntimeError, match="no launch or WorkerPool command is running"):
        notebook_kit.profile(steps=3)


def _pool_loop() -> int:
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(300):  # each backward is a step: no loader, no log(samples=...)
        accelerator.backward(model(torch.randn(8, 4)).sum())
        optimizer.step()
        time.sleep(0.01)
    return 300


def test_profile_during_a_pool_command_profiles_each_worker() -> None:
    found: dict[str, Any] = {}

    def ask() -> None:
        deadline = time.monotonic() + 30
        while "profile" not in found and time.monotonic() < deadline:
            try:
                found["profile"] = notebook_kit.profile(steps=2, timeout=20)
            except RuntimeError:  # the command has not started yet
                time.sleep(0.05)

    asker = threading.Thread(target=ask)
    asker.start()
    with notebook_kit.WorkerPool(num_processes=2, live=False) as pool:
        pool.run(_pool_loop)
    asker.join(10)
    results = found["profile"]
    assert sorted(results) == [0, 1] and all(r.steps == 2 for r in results.values())
    assert all(r.trace.exists() and r.table for r in results.values())


def _one_process(found: dict[str, Any]) -> None:
    try:
        notebook_kit.profile(steps=2)
    except RuntimeError as error:
        found["error"] = str(error)


def test_a_run_in_this_process_is_refused_saying_so() -> None:
    found: dict[str, Any] = {}

    def train() -> None:
        asker = threading.Thread(target=_one_process, args=(found,))
        asker.start()
        asker.join(10)

    notebook_launcher(train, num_processes=1, live=False)
    assert "this run is in this process." in found["error"], found
    assert "accelerator.profile()" in found["error"]
