"""The Accelerator in real launched workers: the same functions on 1 and on 2 processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from notebook_kit import Accelerator, WorkerError, notebook_launcher, set_seed
from notebook_kit.accelerator.operations import gather_object

pytestmark = pytest.mark.integration

SAMPLES = 16
STEP_SAMPLES = 8  # samples per optimizer step, whatever the process count


def _data(length: int = SAMPLES) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(length, 3, generator=generator)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]]), torch.arange(length))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _train_with_accumulation(accelerator: Accelerator) -> dict:
    per_process = STEP_SAMPLES // (2 * accelerator.num_processes)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    loader = DataLoader(_data(), batch_size=per_process)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for x, y, _ in loader:
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return {
        "params": accelerator.gather(_flat(model)[None]),
        "scheduler_steps": scheduler.last_epoch,
        "batches": len(loader),
    }


def _shuffled_epochs(accelerator: Accelerator) -> dict:
    loader = accelerator.prepare(DataLoader(_data(13), batch_size=2, shuffle=True))
    epochs = [[i for _, _, ids in loader for i in ids.tolist()] for _ in range(2)]
    evaluation = accelerator.prepare(DataLoader(_data(13), batch_size=2))
    ids, nested, names = [], [], []
    for x, _, index in evaluation:
        ids.append(accelerator.gather_for_metrics(index))
        nested.append(accelerator.gather_for_metrics({"x": x, "i": [index]})["i"][0])
        names += accelerator.gather_for_metrics([f"s{i}" for i in index.tolist()])
    return {
        "epochs": gather_object([epochs]),  # [rank][epoch] -> sample ids
        "len": len(loader),
        "ids": torch.cat(ids).tolist(),
        "nested": torch.cat(nested).tolist(),
        "names": names,
    }


def _everything(kernel_accelerator_ranks: int) -> dict:
    set_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=2)
    return {
        "fresh_state": (accelerator.num_processes, kernel_accelerator_ranks),
        "rank": accelerator.process_index,
        "accumulation": _train_with_accumulation(accelerator),
        "sharding": _shuffled_epochs(Accelerator()),
    }


def _reference_params() -> torch.Tensor:
    """One process, plain torch, one big batch per optimizer step."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y, _ in DataLoader(_data(), batch_size=STEP_SAMPLES):
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return _flat(model)


@pytest.mark.parametrize("num_processes", [1, 2])
def test_training_semantics(num_processes):
    kernel_accelerator = Accelerator()  # lives in the kernel; must not leak into workers
    result = notebook_launcher(
        _everything, args=(kernel_accelerator.num_processes,), num_processes=num_processes
    )
    assert result["rank"] == 0 and result["fresh_state"] == (num_processes, 1)

    accumulation = result["accumulation"]
    params = accumulation["params"]
    assert params.shape[0] == num_processes
    assert torch.equal(params, params[:1].expand_as(params)), "identical on every rank"
    torch.testing.assert_close(params[0], _reference_params(), atol=1e-6, rtol=0)
    assert accumulation["batches"] == 4
    # Two optimizer steps; without split_batches the schedule advances once per process.
    assert accumulation["scheduler_steps"] == 2 * num_processes

    sharding = result["sharding"]
    per_rank = sharding["epochs"]
    assert sharding["len"] == -(-13 // (2 * num_processes))
    for epoch in range(2):
        seen = [i for rank in per_rank for i in rank[epoch]]
        assert set(seen) == set(range(13)), "the epoch covers the data set"
        # 13 samples in batches of 2: one process sees each once; two complete the last
        # round by wrapping around (3 repeats), and everything else is disjoint.
        assert len(seen) == (13 if num_processes == 1 else 16)
    assert per_rank[0][0] != per_rank[0][1], "a new permutation every epoch"
    assert sharding["ids"] == list(range(13)) and sharding["nested"] == list(range(13))
    assert sharding["names"] == [f"s{i}" for i in range(13)], "objects are de-duplicated too"


def _precision_probe(explicit: str | None) -> dict:
    accelerator = Accelerator(mixed_precision=explicit)
    model = _model()
    dtypes = []
    model[0].register_forward_hook(lambda _m, _i, output: dtypes.append(output.dtype))
    prepared = accelerator.prepare(model)
    loss = prepared(torch.randn(4, 3)).pow(2).mean()
    accelerator.backward(loss)
    return {
        "mixed_precision": accelerator.mixed_precision,
        "inner": dtypes[0],
        "finite": bool(torch.isfinite(loss)),
        "wrapped": type(prepared).__name__,
    }


@pytest.mark.parametrize("num_processes", [1, 2])
def test_launcher_mixed_precision_reaches_every_worker(num_processes):
    inherited = notebook_launcher(
        _precision_probe, args=(None,), num_processes=num_processes, mixed_precision="bf16"
    )
    assert inherited["mixed_precision"] == "bf16" and inherited["inner"] == torch.bfloat16
    assert inherited["finite"]
    expected = "DistributedDataParallel" if num_processes == 2 else "Sequential"
    assert inherited["wrapped"] == expected
    own = notebook_launcher(
        _precision_probe, args=("no",), num_processes=num_processes, mixed_precision="bf16"
    )
    assert own["mixed_precision"] == "no" and own["inner"] == torch.float32


def _train_kernel_model(model: nn.Module, fail_on_rank: int | None) -> torch.Tensor:
    accelerator = Accelerator()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(_data(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y, _ in loader:
        accelerator.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    if accelerator.process_index == fail_on_rank:
        raise RuntimeError("failing after training")
    return _flat(accelerator.unwrap_model(model))


@pytest.mark.parametrize("num_processes", [1, 2])
def test_trained_weights_come_home(num_processes):
    model = _model()
    before = _flat(model)
    trained = notebook_launcher(
        _train_kernel_model, args=(model, None), num_processes=num_processes
    )
    assert not torch.equal(trained, before)
    assert torch.equal(_flat(model), trained), "the kernel's model holds rank 0's weights"


def test_a_failed_run_leaves_the_kernel_model_as_it_was():
    model = _model()
    before = _flat(model)
    with pytest.raises(WorkerError, match="failing after training"):
        notebook_launcher(_train_kernel_model, args=(model, 1), num_processes=2)
    assert torch.equal(_flat(model), before)


_TORCHRUN_SCRIPT = """
import torch
from notebook_kit import Accelerator

accelerator = Accelerator()  # creates the process group from torchrun's environment
model = accelerator.prepare(torch.nn.Linear(2, 1))
ranks = accelerator.gather(torch.tensor([accelerator.process_index]))
accelerator.print(f"{accelerator.num_processes} {ranks.tolist()} {type(model).__name__}")
"""


@pytest.mark.slow
def test_under_torchrun_the_accelerator_creates_the_process_group(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_TORCHRUN_SCRIPT))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*command, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 [0, 1] DistributedDataParallel" in done.stdout
