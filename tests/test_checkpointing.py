"""save_state/load_state in one process: atomic commits, clear refusals, weights-only loading."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from notebook_kit import Accelerator, CheckpointError
from notebook_kit.accelerator import checkpointing


def _setup(accelerator: Accelerator):
    model = nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    loader = DataLoader(TensorDataset(torch.arange(16.0).view(8, 2)), batch_size=2, shuffle=True)
    return accelerator.prepare(model, optimizer, loader, scheduler)


def _step(accelerator, model, optimizer, scheduler, x):
    accelerator.backward(model(x).sum())
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def test_round_trip_restores_weights_optimizer_rng_and_position(tmp_path):
    accelerator = Accelerator()
    model, optimizer, loader, scheduler = _setup(accelerator)
    batches = iter(loader)
    _step(accelerator, model, optimizer, scheduler, next(batches)[0])
    accelerator.save_state(tmp_path / "ckpt")
    expected = {
        "weights": model.weight.detach().clone(),
        "next_batch": next(batches)[0],
        "random": torch.rand(3),
    }
    del batches
    fresh = Accelerator()
    model2, optimizer2, loader2, scheduler2 = _setup(fresh)
    fresh.load_state(tmp_path / "ckpt")
    assert torch.equal(model2.weight, expected["weights"])
    assert optimizer2.state_dict()["state"][0]["step"] == 1
    assert scheduler2.get_last_lr() == scheduler.get_last_lr()
    assert torch.equal(torch.rand(3), expected["random"])
    assert torch.equal(next(iter(loader2))[0], expected["next_batch"])


def test_a_crash_during_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    accelerator = Accelerator()
    model, optimizer, _, scheduler = _setup(accelerator)
    accelerator.save_state(tmp_path)
    saved = model.weight.detach().clone()
    _step(accelerator, model, optimizer, scheduler, torch.ones(2, 2))
    real_write, calls = checkpointing.write_file, []

    def crash_on_second_file(obj, path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        real_write(obj, path)

    monkeypatch.setattr(checkpointing, "write_file", crash_on_second_file)
    with pytest.raises(OSError, match="disk full"):
        accelerator.save_state(tmp_path)
    monkeypatch.undo()
    accelerator.load_state(tmp_path)
    assert torch.equal(model.weight, saved)
    accelerator.save_state(tmp_path)  # the next good save removes the abandoned folder
    assert len(list(tmp_path.glob("state-*"))) == 1


def test_missing_checkpoint_and_missing_file_are_explained(tmp_path):
    accelerator = Accelerator()
    _setup(accelerator)
    with pytest.raises(FileNotFoundError, match="No checkpoint directory"):
        accelerator.load_state(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no save into it ever completed"):
        accelerator.load_state(tmp_path / "empty")
    accelerator.save_state(tmp_path / "ckpt")
    next((tmp_path / "ckpt").glob("state-*/optimizer_0.pt")).unlink()
    with pytest.raises(FileNotFoundError, match=r"optimizer_0\.pt is missing"):
        accelerator.load_state(tmp_path / "ckpt")


def test_incompatible_checkpoints_are_refused(tmp_path):
    accelerator = Accelerator()
    _setup(accelerator)
    accelerator.save_state(tmp_path)
    manifest_path = tmp_path / checkpointing.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "world_size": 2}))
    with pytest.raises(CheckpointError, match="saved by 2 processes, but this run has 1"):
        accelerator.load_state(tmp_path)
    manifest_path.write_text(json.dumps(manifest))
    other = Accelerator()
    other.prepare(nn.Linear(2, 1))
    with pytest.raises(CheckpointError, match="holds 1 optimizers, but 0 were prepared"):
        other.load_state(tmp_path)


class _NotATensor:
    pass


def test_loading_is_weights_only(tmp_path):
    accelerator = Accelerator()
    _setup(accelerator)
    accelerator.save_state(tmp_path)
    target = next(tmp_path.glob("state-*/scheduler_0.pt"))
    torch.save({"payload": _NotATensor()}, target)  # arbitrary pickled code
    with pytest.raises(Exception, match="Weights only load failed"):
        accelerator.load_state(tmp_path)


def test_numbered_checkpoints_in_project_dir(tmp_path):
    accelerator = Accelerator(project_dir=tmp_path)
    model, *_ = _setup(accelerator)
    with pytest.raises(FileNotFoundError, match="No checkpoint_<n>"):
        accelerator.load_state()
    first = accelerator.save_state()
    with torch.no_grad():
        model.weight.add_(1.0)
    second = accelerator.save_state()
    assert (first.name, second.name) == ("checkpoint_0", "checkpoint_1")
    expected = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state()
    assert torch.equal(model.weight, expected)
    with pytest.raises(ValueError, match="project_dir"):
        Accelerator().save_state()
