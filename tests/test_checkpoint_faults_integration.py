"""Checkpoints against real faults: a process SIGKILLed mid-save, a filesystem that is full, a
sharded checkpoint with a shard gone, a second run saving into the same project_dir.

All use real processes and real files, nothing patched: a child process is killed while it
writes a large state, a real, tiny tmpfs runs out of space (skipped where mounting is not
permitted), and a real FSDP2 launch saves the sharded checkpoint whose shard is then deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from notebook_kit import Accelerator, CheckpointError, notebook_launcher
from notebook_kit.accelerator.checkpointing import MANIFEST
from notebook_kit.accelerator.configuration import ProjectConfiguration
from notebook_kit.accelerator.writer_lease import LAPSE, LEASE
from tests.fsdp_models import TinyLM

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]

WIDTH = 4096  # a 4096 x 2048 float32 layer: 32 MiB per model file, slow enough to be caught

SAVER = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn
    from notebook_kit import Accelerator
    from notebook_kit.accelerator.configuration import ProjectConfiguration

    WIDTH = int(sys.argv[2])
    accelerator = Accelerator(project_config=ProjectConfiguration(sys.argv[1], total_limit=2))
    model = accelerator.prepare(nn.Linear(WIDTH, 2048, bias=False))
    for index in range(3):
        with torch.no_grad():
            model.weight.fill_(float(index))
        if index == 2:
            print("third save", flush=True)
        accelerator.save_state()
    print("all saved", flush=True)
    """
)


def _wait_for_partial_save(folder: Path, child: subprocess.Popen[str]) -> None:
    """Return once a model file of the save into ``folder`` has bytes on disk."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.poll() is None:
        if any(f.stat().st_size > 0 for f in folder.glob("state-*/model_0.pt") if f.exists()):
            return
        time.sleep(0.001)
    raise AssertionError("the third save never started writing")


def _loadable(folder: Path) -> float | None:
    """The weight value of the checkpoint in ``folder``, or None if it does not load."""
    accelerator = Accelerator()
    model = accelerator.prepare(nn.Linear(WIDTH, 2048, bias=False))
    try:
        accelerator.load_state(folder)
    except (FileNotFoundError, ValueError):
        return None
    return model.weight[0, 0].item()


def test_total_limit_keeps_two_good_checkpoints_after_a_kill_mid_save(tmp_path: Path) -> None:
    project = tmp_path / "project"
    child = subprocess.Popen(
        [sys.executable, "-c", SAVER, str(project), str(WIDTH)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "third save"
        _wait_for_partial_save(project / "checkpoints" / "checkpoint_2", child)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    checkpoints = project / "checkpoints"
    assert not (checkpoints / "checkpoint_2" / MANIFEST).exists(), "killed after the commit"

    accelerator = Accelerator(project_config=ProjectConfiguration(project, total_limit=2))
    model = accelerator.prepare(nn.Linear(WIDTH, 2048, bias=False))
    accelerator.load_state()  # the newest *complete* checkpoint is chosen
    assert model.weight[0, 0].item() == 1.0
    with torch.no_grad():
        model.weight.fill_(3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.save_state()

    values = {path.name: _loadable(path) for path in sorted(checkpoints.iterdir())}
    assert sorted(v for v in values.values() if v is not None) == [1.0, 3.0], values
    assert None not in values.values(), f"an incomplete checkpoint was kept: {values}"
    reports = [str(w.message) for w in caught if "did not finish" in str(w.message)]
    assert len(reports) == 1 and "checkpoint_2" in reports[0]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 3 MiB tmpfs; skipped where this process may not mount one."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_disk_is_explained_cleaned_up_and_recoverable(small_disk: Path) -> None:
    accelerator = Accelerator(project_dir=small_disk)
    model = accelerator.prepare(nn.Linear(256, 256, bias=False))  # 256 KiB per save
    with torch.no_grad():
        model.weight.fill_(1.0)
    accelerator.save_state()
    filler = small_disk / "filler"
    with open(filler, "wb") as handle:  # leave about 100 KiB free
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        handle.write(b"\0" * (free - 100 * 1024))
    with torch.no_grad():
        model.weight.fill_(2.0)
    with pytest.raises(OSError) as caught:
        accelerator.save_state()
    message = str(caught.value)
    target = small_disk / "checkpoints" / "checkpoint_1"
    assert message.startswith(f"No space left on device while saving checkpoint 1 to {target}")
    assert "needed ≈ 0.3 MB" in message
    assert not target.exists(), "the partial save was left behind"

    accelerator.load_state()  # the previous checkpoint still loads
    assert model.weight[0, 0].item() == 1.0

    filler.unlink()  # the user frees space; training goes on
    with torch.no_grad():
        model.weight.fill_(3.0)
    assert accelerator.save_state().name == "checkpoint_1"
    accelerator.load_state()
    assert model.weight[0, 0].item() == 3.0


def _save_sharded(folder: str) -> str:
    accelerator = Accelerator()  # the launch's fsdp=True shards it
    model = TinyLM()
    accelerator.prepare(model, torch.optim.Adam(model.parameters()))
    return str(accelerator.save_state(folder))


def _load_sharded(folder: str) -> tuple[str, str]:
    accelerator = Accelerator()
    model = TinyLM()
    accelerator.prepare(model, torch.optim.Adam(model.parameters()))
    try:
        accelerator.load_state(folder)
    except ValueError as error:
        return type(error).__name__, str(error)
    return "loaded", ""


@pytest.fixture(scope="module")
def sharded_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sharded checkpoint (model and optimizer) saved by a real 2-rank FSDP2 launch."""
    folder = tmp_path_factory.mktemp("sharded") / "checkpoint"
    return Path(notebook_launcher(_save_sharded, args=(str(folder),), num_processes=2, fsdp=True))


def _damage(saved: Path, into: Path, how: str) -> tuple[Path, Path]:
    """A copy of ``saved`` with rank 1's model shard deleted, or rank 0's optimizer shard cut."""
    copy = Path(shutil.copytree(saved, into / saved.name))
    if how == "missing":
        (shard,) = copy.glob("state-*/pytorch_model_fsdp_0/__1_*.distcp")
        shard.unlink()
    else:
        (shard,) = copy.glob("state-*/optimizer_0/__0_*.distcp")
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return copy, shard


@pytest.mark.parametrize("how", ["missing", "truncated"])
def test_a_damaged_shard_is_a_checkpoint_error_naming_the_file(
    sharded_checkpoint: Path, tmp_path: Path, how: str
) -> None:
    damaged, shard = _damage(sharded_checkpoint, tmp_path, how)
    said = {"missing": "is missing", "truncated": "ends early"}[how]
    kind, message = notebook_launcher(
        _load_sharded, args=(str(damaged),), num_processes=2, fsdp=True
    )
    assert kind == "CheckpointError", message
    assert f"{shard} {said}" in message, message
    assert "Traceback" not in message and "CheckpointException" not in message


def test_merge_weights_of_a_checkpoint_missing_a_shard_says_so_in_one_line(
    sharded_checkpoint: Path, tmp_path: Path
) -> None:
    damaged, shard = _damage(sharded_checkpoint, tmp_path, "missing")
    out = tmp_path / "out"
    merged = subprocess.run(
        [sys.executable, "-m", "notebook_kit", "merge-weights", str(damaged), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert merged.returncode != 0 and merged.stdout == ""
    lines = merged.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{shard} is missing" in lines[0], merged.stderr
    assert not out.exists()


WRITER = textwrap.dedent(
    """
    import sys
    import torch
    from notebook_kit import Accelerator

    accelerator = Accelerator(project_dir=sys.argv[1])
    accelerator.prepare(torch.nn.Linear(2, 1))
    accelerator.save_state()
    print("saved", flush=True)
    sys.stdin.readline()  # alive until the test closes its input
    """
)


def test_a_second_run_saving_into_the_same_project_dir_is_refused_until_the_first_is_gone(
    tmp_path: Path,
) -> None:
    project = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(project)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None and first.stdout.readline() == "saved\n"
        second = Accelerator(project_dir=project)
        second.prepare(nn.Linear(2, 1))
        with pytest.raises(CheckpointError, match=rf"pid {first.pid} on {socket.gethostname()}"):
            second.save_state()
        assert sorted(p.name for p in (project / "checkpoints").iterdir()) == ["checkpoint_0"]
    finally:
        first.communicate("\n", timeout=60)  # the first run ends; its lease is not given back
    assert second.save_state().name == "checkpoint_1"  # its pid is gone: taken over
    assert json.loads((project / LEASE).read_text())["pid"] == os.getpid()


def test_a_lease_from_another_machine_holds_until_it_lapses(tmp_path: Path) -> None:
    accelerator = Accelerator(project_dir=tmp_path)
    accelerator.prepare(nn.Linear(2, 1))
    elsewhere = {"host": "node-7", "pid": 1, "since": time.time(), "token": "another run"}
    (tmp_path / LEASE).write_text(json.dumps({**elsewhere, "renewed": time.time() - 60}))
    with pytest.raises(CheckpointError, match=r"pid 1 on node-7, since .* UTC"):
        accelerator.save_state()
    (tmp_path / LEASE).write_text(json.dumps({**elsewhere, "renewed": time.time() - LAPSE - 1}))
    assert accelerator.save_state().name == "checkpoint_0"
