"""save_state/load_state in one process: atomic commits, clear refusals, weights-only loading."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from notebook_kit import Accelerator, CheckpointError
from notebook_kit.accelerator import checkpointing
from notebook_kit.accelerator.configuration import ProjectConfiguration


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
            raise OSError("disk broken")
        real_write(obj, path)

    monkeypatch.setattr(checkpointing, "write_file", crash_on_second_file)
    with pytest.raises(OSError, match="disk broken"):
        accelerator.save_state(tmp_path)
    monkeypatch.undo()
    assert len(list(tmp_path.glob("state-*"))) == 1  # the failed save removed its folder
    accelerator.load_state(tmp_path)
    assert torch.equal(model.weight, saved)


def _full_disk_after(limit: int):
    """A write_file whose disk fills after ``limit`` bytes, failing the way torch.save does."""
    real_write, written = checkpointing.write_file, [0]

    def write(obj, path):
        real_write(obj, path)
        written[0] += path.stat().st_size
        if written[0] > limit:
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError:  # torch raises this, with the OSError only as its context
                raise RuntimeError("[enforce fail at inline_container.cc:672]")  # noqa: B904

    return write


def test_a_full_disk_is_named_cleaned_up_and_recoverable(tmp_path, monkeypatch):
    accelerator = Accelerator(project_dir=tmp_path)
    model = accelerator.prepare(nn.Linear(500, 1000))  # 2 MB of weights
    accelerator.save_state()
    saved = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    monkeypatch.setattr(checkpointing, "write_file", _full_disk_after(100_000))
    with pytest.raises(OSError) as caught:
        accelerator.save_state()
    target = tmp_path / "checkpoints" / "checkpoint_1"
    assert caught.value.errno == errno.ENOSPC
    assert str(caught.value).startswith(
        f"No space left on device while saving checkpoint 1 to {target} (needed ≈ 2.0 MB, "
    )
    assert "free some space" in str(caught.value)
    assert not target.exists()
    monkeypatch.undo()  # space was freed
    accelerator.load_state()
    assert torch.equal(model.weight, saved)
    with torch.no_grad():
        model.weight.add_(1.0)
    assert accelerator.save_state().name == "checkpoint_1"


def test_a_full_disk_in_a_named_directory_keeps_its_checkpoint(tmp_path, monkeypatch):
    accelerator = Accelerator()
    _setup(accelerator)
    accelerator.save_state(tmp_path / "ckpt")
    monkeypatch.setattr(checkpointing, "write_file", _full_disk_after(0))
    with pytest.raises(OSError, match=r"while saving checkpoint to .*ckpt \(needed ≈ 0\.0 MB"):
        accelerator.save_state(tmp_path / "ckpt")
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "ckpt").glob("state-*")] == [
        json.loads((tmp_path / "ckpt" / checkpointing.MANIFEST).read_text())["folder"]
    ]
    accelerator.load_state(tmp_path / "ckpt")


def test_what_a_killed_save_left_is_removed_before_the_next_save(tmp_path):
    accelerator = Accelerator()
    _setup(accelerator)
    accelerator.save_state(tmp_path)
    leftover = tmp_path / "state-0123456789ab"  # a killed save: files, no manifest naming it
    leftover.mkdir()
    (leftover / "model_0.pt").write_bytes(b"\0" * 1000)
    (tmp_path / f".{checkpointing.MANIFEST}.5e1f").write_text("{")
    accelerator.save_state(tmp_path)
    assert len(list(tmp_path.glob("state-*"))) == 1 and not leftover.exists()
    assert not list(tmp_path.glob(".checkpoint.json.*"))


def test_total_limit_counts_only_complete_checkpoints(tmp_path):
    project = ProjectConfiguration(tmp_path, total_limit=2)
    accelerator = Accelerator(project_config=project)
    model, *_ = _setup(accelerator)
    accelerator.save_state()
    accelerator.save_state()
    unfinished = tmp_path / "checkpoints" / "checkpoint_2" / "state-00aa"
    unfinished.mkdir(parents=True)  # killed inside the third save
    (unfinished / "model_0.pt").write_bytes(b"\0" * 100)
    foreign = tmp_path / "checkpoints" / "checkpoint_7"  # not written by save_state
    foreign.mkdir()
    (foreign / "model.safetensors").write_bytes(b"")
    with pytest.warns(UserWarning) as caught:
        accelerator.save_state()
        accelerator.save_state()
    reports = sorted({str(warning.message).split(":")[0] for warning in caught})
    assert reports == [f"Ignoring {foreign}", f"Removed {unfinished.parent}"]
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["checkpoint_7", "checkpoint_8", "checkpoint_9"]
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state()  # the newest complete one, never the foreign folder


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


def test_checkpoints_of_other_objects_are_refused(tmp_path):
    accelerator = Accelerator()
    _setup(accelerator)
    accelerator.save_state(tmp_path)
    manifest_path = tmp_path / checkpointing.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "world_size": 2}))
    accelerator.load_state(tmp_path)  # another world size loads: its data position is global
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
    with pytest.raises(CheckpointError, match=r"scheduler_0\.pt cannot be read: .*never executed"):
        accelerator.load_state(tmp_path)


def test_numbered_checkpoints_in_project_dir(tmp_path):
    accelerator = Accelerator(project_dir=tmp_path)
    model, *_ = _setup(accelerator)
    assert accelerator.load_state() is None  # nothing yet: a fresh start, not an error
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


def _damage_manifest(directory, text):
    (directory / checkpointing.MANIFEST).write_text(text)


def _damage_file(directory, name, blob):
    next(directory.glob(f"state-*/{name}")).write_bytes(blob)


def _truncate(directory, name):
    path = next(directory.glob(f"state-*/{name}"))
    path.write_bytes(path.read_bytes()[:100])


def _replace_file(directory, name, obj):
    torch.save(obj, next(directory.glob(f"state-*/{name}")))


DAMAGE = {
    "empty model file": (lambda d: _damage_file(d, "model_0.pt", b""), r"model_0\.pt.*is empty"),
    "truncated model file": (lambda d: _truncate(d, "model_0.pt"), r"model_0\.pt cannot be read"),
    "garbage optimizer file": (
        lambda d: _damage_file(d, "optimizer_0.pt", b"PK\x03\x04" + b"\x00" * 300),
        r"optimizer_0\.pt cannot be read",
    ),
    "manifest is a list": (lambda d: _damage_manifest(d, "[1, 2]"), r"checkpoint\.json holds a"),
    "manifest is not JSON": (lambda d: _damage_manifest(d, "{"), r"checkpoint\.json cannot be"),
    "manifest field missing": (
        lambda d: _damage_manifest(d, '{"format": 1, "folder": "state-0a", "world_size": 1}'),
        r"checkpoint\.json has 'counts' = None",
    ),
    "process file is a list": (
        lambda d: _replace_file(d, "process_0.pt", [1, 2]),
        r"process_0\.pt does not hold RNG states",
    ),
    "weights of another shape": (
        lambda d: _replace_file(d, "model_0.pt", {"weight": torch.zeros(3, 3)}),
        r"model_0\.pt does not fit the Linear of this run",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_names_the_file_and_the_problem(tmp_path, damage):
    accelerator = Accelerator()
    _setup(accelerator)
    accelerator.save_state(tmp_path)
    make_damage, message = DAMAGE[damage]
    make_damage(tmp_path)
    with pytest.raises(CheckpointError, match=message) as caught:
        accelerator.load_state(tmp_path)
    assert str(tmp_path) in str(caught.value)


@pytest.mark.parametrize("folder", ["../elsewhere", "/tmp", "state-ab/../../elsewhere", ""])
def test_a_manifest_never_leads_outside_the_checkpoint(tmp_path, folder):
    accelerator = Accelerator()
    _setup(accelerator)
    accelerator.save_state(tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / checkpointing.MANIFEST).read_text())
    outside = tmp_path / "elsewhere"  # a complete, loadable state folder outside
    next((tmp_path / "ckpt").glob("state-*")).rename(outside)
    _damage_manifest(tmp_path / "ckpt", json.dumps({**manifest, "folder": folder}))
    with pytest.raises(CheckpointError, match="never reads outside the checkpoint"):
        accelerator.load_state(tmp_path / "ckpt")


def test_a_state_folder_that_links_outside_is_refused(tmp_path):
    accelerator = Accelerator()
    _setup(accelerator)
    accelerator.save_state(tmp_path / "ckpt")
    state = next((tmp_path / "ckpt").glob("state-*"))
    state.rename(tmp_path / "elsewhere")
    state.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="never reads outside the checkpoint"):
        accelerator.load_state(tmp_path / "ckpt")


def test_a_missing_state_folder_is_named_and_load_state_falls_back_to_the_newest_whole_one(
    tmp_path,
):
    accelerator = Accelerator(project_dir=tmp_path)
    model, *_ = _setup(accelerator)
    accelerator.save_state()
    expected = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    second = accelerator.save_state()
    for state in second.glob("state-*"):  # removed by hand, or by another run
        for path in state.iterdir():
            path.unlink()
        state.rmdir()
    with pytest.raises(
        CheckpointError, match=r"names the state folder state-\w+, which is missing"
    ):
        accelerator.load_state(second)
    with pytest.warns(UserWarning, match=r"checkpoint_0, the newest complete .*checkpoint_1 \("):
        loaded = accelerator.load_state()
    assert loaded.name == "checkpoint_0" and torch.equal(model.weight, expected)
