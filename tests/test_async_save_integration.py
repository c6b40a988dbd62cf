"""``save_state(async_save=True)`` with real processes, real collectives and real files: what is
written is the state at the call, the commit waits for every rank, the end of the function
waits for the write, an abandoned or failed write is never loaded, FSDP2 and S3 alike.

The workers hold their own background writes at a gate (``write_file`` wrapped in the worker,
for writes made off the main thread only), so "weights changed while the write is pending"
and "one rank not done yet" happen every time, not by luck of timing.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from notebook_kit import (
    Accelerator,
    FullyShardedDataParallelPlugin,
    ProjectConfiguration,
    WorkerError,
    notebook_launcher,
)
from notebook_kit.accelerator import checkpointing
from notebook_kit.accelerator.checkpoint_files import MANIFEST, CheckpointSaveError
from tests.fsdp_models import TinyLM, batches, lm_loss

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


def _hold_background_writes(
    holding: bool = True, failing: bool = False
) -> Callable[[int], threading.Event]:
    """Make this process's background checkpoint writes wait (when ``holding``) and then fail
    with an I/O error (when ``failing``). Returns ``gate``: the writes of this process's save
    number ``k`` (counted from 0 here) wait for ``gate(k)``.

    Saves never overlap, and each background save has a thread of its own, named after its
    folder, so the ``k``-th such thread to write is save ``k``, however late it starts.
    """
    gates: list[threading.Event] = []
    saves: dict[str, int] = {}
    original = checkpointing.write_file

    def gate(number: int) -> threading.Event:
        while len(gates) <= number:
            gates.append(threading.Event())
        return gates[number]

    def write(state, path) -> None:
        thread = threading.current_thread()
        if thread is not threading.main_thread():
            if holding:
                gate(saves.setdefault(thread.name, len(saves))).wait()
            if failing:
                raise OSError(errno.EIO, "Input/output error (storage unavailable)", str(path))
        original(state, path)

    checkpointing.write_file = write
    return gate


def _prepared(accelerator: Accelerator):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    data = TensorDataset(torch.arange(96.0).view(32, 3))
    loader = DataLoader(data, batch_size=2, shuffle=True)
    return accelerator.prepare(model, optimizer, loader)


def _step(accelerator: Accelerator, model, optimizer, batch) -> None:
    accelerator.backward(model(batch[0] / 96).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


def _snapshot(model, optimizer) -> dict[str, torch.Tensor]:
    weight = accelerator_free(model).weight
    return {
        "weight": weight.detach().clone(),
        "exp_avg": optimizer.optimizer.state[weight]["exp_avg"].clone(),
    }


def accelerator_free(model) -> nn.Module:
    return getattr(model, "module", model)


def _mutate(model, optimizer) -> None:
    weight = accelerator_free(model).weight
    with torch.no_grad():
        weight.add_(100.0)
        optimizer.optimizer.state[weight]["exp_avg"].add_(100.0)


def _train_and_save_asynchronously(project: str) -> dict[str, object]:
    """Four async saves with training between them (total_limit=2); the last one is still
    pending when the function returns. Each write is held until the weights have changed."""
    accelerator = Accelerator(project_config=ProjectConfiguration(project, total_limit=2))
    model, optimizer, loader = _prepared(accelerator)
    rank = accelerator.process_index
    batches_seen = iter(loader)
    committed_while_held = []
    gates = _hold_background_writes(holding=True)
    for number in range(4):
        _step(accelerator, model, optimizer, next(batches_seen))
        gate = gates(number)
        expected = _snapshot(model, optimizer)
        where = accelerator.save_state(async_save=True)
        _mutate(model, optimizer)  # the write has not started: it must use the copy
        if rank == 1 and number == 0:
            _wait_for_rank_0s_files(where)  # and some time to commit, were it not held
        committed_while_held.append((where / MANIFEST).exists())
        if rank == 0:
            gate.set()
        else:  # released only after the function returned: the end of the run must wait
            threading.Timer(0.5 if number == 3 else 0.0, gate.set).start()
        with torch.no_grad():  # back to the values at the call, to train on from there
            accelerator_free(model).weight.copy_(expected["weight"])
            weight = accelerator_free(model).weight
            optimizer.optimizer.state[weight]["exp_avg"].copy_(expected["exp_avg"])
    return {
        "expected": expected,
        "next": next(batches_seen)[0],
        "where": str(where),
        "committed_while_held": _everyones(committed_while_held),
    }


def _everyones(seen: object) -> list[object]:
    """What every rank saw, on every rank (rank 1 is the one that watches for the commit)."""
    everyone: list[object] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(everyone, seen)
    return everyone


def _wait_for_rank_0s_files(where: Path) -> None:
    """Return a second after rank 0's last file (its own) of the save into ``where`` exists."""
    deadline = time.monotonic() + 30
    while not any(where.glob("state-*/process_0.pt")) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(1.0)


def _resume(project: str) -> dict[str, object]:
    accelerator = Accelerator(project_config=ProjectConfiguration(project, total_limit=2))
    model, optimizer, loader = _prepared(accelerator)
    loaded = accelerator.load_state()
    return {"loaded": str(loaded), **_snapshot(model, optimizer), "next": next(iter(loader))[0]}


def test_async_saves_on_two_ranks_hold_the_state_at_the_call_and_commit_after_every_rank(
    tmp_path: Path,
) -> None:
    project = str(tmp_path / "run")
    saved = notebook_launcher(_train_and_save_asynchronously, args=(project,), num_processes=2)
    assert saved["committed_while_held"] == [[False] * 4] * 2, "committed before rank 1 wrote"
    checkpoints = tmp_path / "run" / "checkpoints"
    names = sorted(path.name for path in checkpoints.iterdir())
    assert names == ["checkpoint_2", "checkpoint_3"], "total_limit or the end-of-run wait"
    assert (checkpoints / "checkpoint_3" / MANIFEST).is_file()
    resumed = notebook_launcher(_resume, args=(project,), num_processes=2)
    assert resumed["loaded"] == saved["where"]
    assert torch.equal(resumed["weight"], saved["expected"]["weight"])
    assert torch.equal(resumed["exp_avg"], saved["expected"]["exp_avg"])
    assert torch.equal(resumed["next"], saved["next"])  # the data position came back


def _fail_then_abandon(project: str) -> None:
    """A committed save, a background write that fails on rank 1, then a save still pending
    when both processes end abruptly. Rank 0 leaves what it saw in ``seen.pt``."""
    accelerator = Accelerator(project_config=ProjectConfiguration(project))
    model, optimizer, loader = _prepared(accelerator)
    rank = accelerator.process_index
    _step(accelerator, model, optimizer, next(iter(loader)))
    accelerator.save_state(async_save=True)  # checkpoint_0
    good = _snapshot(model, optimizer)
    _hold_background_writes(holding=False, failing=rank == 1)
    accelerator.save_state(async_save=True)  # checkpoint_1: fails in the background on rank 1
    try:
        accelerator.save_state(async_save=True)
        message = "no error"
    except CheckpointSaveError as error:
        message = str(error)
    listing = sorted(path.name for path in (Path(project) / "checkpoints").iterdir())
    if rank == 0:
        torch.save({"message": message, "listing": listing, **good}, Path(project) / "seen.pt")
    _hold_background_writes(holding=rank == 1)  # rank 1 never writes checkpoint_1
    _mutate(model, optimizer)
    accelerator.save_state(async_save=True)
    time.sleep(0.5)
    if rank == 1:
        os._exit(3)  # killed with its write pending
    raise KeyboardInterrupt  # rank 0 interrupted: its pending save is abandoned, not awaited


def test_a_failed_write_is_raised_at_the_next_save_and_an_abandoned_one_is_never_loaded(
    tmp_path: Path,
) -> None:
    project = tmp_path / "run"
    with pytest.raises(WorkerError):
        notebook_launcher(_fail_then_abandon, args=(str(project),), num_processes=2)
    seen = torch.load(project / "seen.pt")
    assert "checkpoint 1" in seen["message"] and "was not saved" in seen["message"]
    assert "rank 1" in seen["message"] and "storage unavailable" in seen["message"]
    assert seen["listing"] == ["checkpoint_0"], "the failed save left files behind"
    assert not (project / "checkpoints" / "checkpoint_1" / MANIFEST).exists()
    resumed = notebook_launcher(_resume, args=(str(project),), num_processes=2)
    assert resumed["loaded"].endswith("checkpoint_0")
    assert torch.equal(resumed["weight"], seen["weight"])
    assert torch.equal(resumed["exp_avg"], seen["exp_avg"])


def test_async_save_refuses_a_flag_that_is_not_a_bool(tmp_path: Path) -> None:
    accelerator = Accelerator()
    _prepared(accelerator)
    with pytest.raises(TypeError, match=r"async_save=.*True or False, got 'yes'"):
        accelerator.save_state(tmp_path / "ckpt", async_save="yes")
    assert not (tmp_path / "ckpt").exists()


def _fsdp_async_round_trip(directory: str) -> dict[str, bool]:
    from notebook_kit.accelerator.strategies import fsdp_state

    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="size_based_wrap", min_num_params=100, state_dict_type="SHARDED_STATE_DICT"
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = TinyLM()
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), 0.05))
    rank, size = accelerator.process_index, accelerator.num_processes
    for tokens in batches(2, 1):
        accelerator.backward(lm_loss(model, tokens[rank::size]))
        optimizer.step()
        optimizer.zero_grad()
    gate = threading.Event()
    original = fsdp_state.ShardedParts.write

    def held(self, folder, states, process_group):
        gate.wait()
        original(self, folder, states, process_group)

    fsdp_state.ShardedParts.write = held
    params = dict(model.named_parameters())
    expected = {name: p.detach().full_tensor().clone() for name, p in params.items()}
    moments = {
        n: optimizer.optimizer.state[p]["exp_avg_sq"].full_tensor() for n, p in params.items()
    }
    accelerator.save_state(directory, async_save=True)
    with torch.no_grad():
        for p in params.values():
            p.to_local().add_(7.0)
            optimizer.optimizer.state[p]["exp_avg_sq"].to_local().add_(7.0)
    gate.set()
    accelerator.load_state(directory)  # waits for the write first
    return {
        "weights": all(torch.equal(p.full_tensor(), expected[n]) for n, p in params.items()),
        "moments": all(
            torch.equal(optimizer.optimizer.state[p]["exp_avg_sq"].full_tensor(), moments[n])
            for n, p in params.items()
        ),
    }


def test_a_sharded_fsdp2_async_save_resumes_to_the_state_at_the_call(tmp_path: Path) -> None:
    directory = str(tmp_path / "sharded")
    result = notebook_launcher(_fsdp_async_round_trip, args=(directory,), num_processes=2)
    assert result == {"weights": True, "moments": True}
    assert (tmp_path / "sharded" / MANIFEST).is_file()


@pytest.mark.skipif(
    importlib.util.find_spec("s3fs") is None or importlib.util.find_spec("moto") is None,
    reason="needs s3fs and moto: pip install 'notebook_kit[s3]' 'moto[server]'",
)
def test_an_async_save_to_s3_holds_the_state_at_the_call_and_keeps_total_limit() -> None:
    from tests.s3_server import s3_server

    with s3_server() as s3:
        bucket = s3.make_bucket(f"nbk-{uuid.uuid4().hex[:12]}")
        config = ProjectConfiguration(
            project_dir=f"s3://{bucket}/run", total_limit=1, storage_options=s3.options
        )
        accelerator = Accelerator(project_config=config)
        model, optimizer, loader = _prepared(accelerator)
        for batch in list(loader)[:2]:
            _step(accelerator, model, optimizer, batch)
            expected = _snapshot(model, optimizer)
            where = accelerator.save_state(async_save=True)
            _mutate(model, optimizer)
        assert str(where) == f"s3://{bucket}/run/checkpoints/checkpoint_1"
        assert str(accelerator.load_state()) == str(where)
        assert torch.equal(model.weight, expected["weight"])
        assert torch.equal(optimizer.optimizer.state[model.weight]["exp_avg"], expected["exp_avg"])
        listing = s3.filesystem().ls(f"{bucket}/run/checkpoints")
        assert [path.rsplit("/", 1)[1] for path in listing] == ["checkpoint_1"]


def test_a_save_pending_when_every_rank_raises_is_never_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rank, in this process (it lives on after the function, as a pool's workers do):
    the function raises while its save's last file is held; the write then ends and must
    not be committed."""
    reached, released = threading.Event(), threading.Event()
    original, written = checkpointing.write_file, []

    def hold_the_last_file(state, path) -> None:
        if path.name.startswith("process_"):  # this rank's own file, written last
            reached.set()
            released.wait()
        original(state, path)
        written.append(path.name)

    monkeypatch.setattr(checkpointing, "write_file", hold_the_last_file)

    def fails_with_its_save_pending() -> None:
        accelerator = Accelerator(project_dir=tmp_path)
        _prepared(accelerator)
        accelerator.save_state(async_save=True)
        reached.wait(timeout=60)  # the other files are written
        raise RuntimeError("the training failed")

    with pytest.raises(RuntimeError, match="the training failed"):
        notebook_launcher(fails_with_its_save_pending, num_processes=1)
    released.set()
    for thread in threading.enumerate():
        if thread.name.startswith("save_state"):
            thread.join(timeout=60)
    assert "process_0.pt" in written, "the held write did not go on"
    assert not (tmp_path / "checkpoints" / "checkpoint_0" / MANIFEST).exists()
