"""Training checkpoints that are all-or-nothing.

A checkpoint directory holds a ``checkpoint.json`` manifest and one ``state-<id>/`` folder of
files. A save writes a fresh folder, waits until every process has written its part, and only
then replaces the manifest with one ``os.replace``: that rename is the commit. A crash at any
earlier moment leaves the previous manifest pointing at the previous, untouched folder. Stale
folders are removed after the next successful commit.

Rank 0 writes models, optimizers, schedulers, the GradScaler and registered objects (they are
identical on every rank); every rank writes its own RNG states and data-loader positions.
Everything is read back with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from notebook_kit.accelerator.operations import broadcast_object, world_size
from notebook_kit.atomic_file import replace_atomically
from notebook_kit.runtime.seeding import get_rng_states, set_rng_states

__all__ = ["CheckpointError", "Stateful", "load_checkpoint", "save_checkpoint"]

MANIFEST = "checkpoint.json"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint exists but cannot be loaded into this run."""


@dataclass
class Stateful:
    """What a checkpoint covers, as lists of objects with ``state_dict``/``load_state_dict``."""

    models: Sequence[torch.nn.Module] = ()
    optimizers: Sequence[Any] = ()
    schedulers: Sequence[Any] = ()
    dataloaders: Sequence[Any] = ()
    custom: Sequence[Any] = ()
    scaler: Any = None
    counts: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.counts = {
            "models": len(self.models),
            "optimizers": len(self.optimizers),
            "schedulers": len(self.schedulers),
            "dataloaders": len(self.dataloaders),
            "custom": len(self.custom),
            "scaler": int(self.scaler is not None),
        }

    def shared_files(self) -> dict[str, Any]:
        """File name -> object, for the objects every rank holds identically."""
        files = {f"model_{i}.pt": m for i, m in enumerate(self.models)}
        files |= {f"optimizer_{i}.pt": o for i, o in enumerate(self.optimizers)}
        files |= {f"scheduler_{i}.pt": s for i, s in enumerate(self.schedulers)}
        files |= {f"custom_{i}.pt": c for i, c in enumerate(self.custom)}
        if self.scaler is not None:
            files["scaler.pt"] = self.scaler
        return files


def _barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def write_file(obj: Any, path: Path) -> None:
    """``torch.save`` that reaches the disk before returning (a later rename depends on it)."""
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _commit(directory: Path, manifest: dict[str, Any]) -> None:
    text = json.dumps(manifest, indent=2).encode()
    replace_atomically(directory / MANIFEST, lambda handle: handle.write(text), durable=True)


def save_checkpoint(directory: str | os.PathLike[str], state: Stateful, process_index: int) -> Path:
    """Write ``state`` into ``directory`` atomically; collective over all processes.

    Example:
        >>> save_checkpoint("ckpt", Stateful(models=[model], optimizers=[optimizer]), 0)
    """
    directory = Path(directory)
    folder = broadcast_object(f"state-{uuid.uuid4().hex[:12]}")
    staging = directory / folder
    staging.mkdir(parents=True, exist_ok=True)
    if process_index == 0:
        for name, obj in state.shared_files().items():
            write_file(obj.state_dict(), staging / name)
    own = {
        "rng": get_rng_states(),
        "dataloaders": [loader.state_dict() for loader in state.dataloaders],
    }
    write_file(own, staging / f"process_{process_index}.pt")
    _barrier()  # every rank's files are on disk before the commit
    if process_index == 0:
        manifest = {
            "format": FORMAT_VERSION,
            "folder": folder,
            "world_size": world_size(),
            "counts": state.counts,
        }
        _commit(directory, manifest)
        for stale in directory.glob("state-*"):
            if stale.name != folder:
                shutil.rmtree(stale, ignore_errors=True)
    _barrier()  # nobody reads the checkpoint before it is committed
    return directory


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The committed manifest of ``directory``, or a FileNotFoundError that says why not."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"No checkpoint directory at {directory}.")
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{directory} holds no {MANIFEST}: it was not written by save_state, or no save "
            "into it ever completed."
        )
    with open(path) as handle:
        return json.load(handle)


def _load(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(
            f"Checkpoint file {path} is missing; the checkpoint was modified after it was saved."
        )
    return torch.load(path, map_location="cpu", weights_only=True)


def _check_compatible(manifest: dict[str, Any], state: Stateful, directory: Path) -> None:
    saved_size = manifest.get("world_size")
    if saved_size != world_size():
        raise CheckpointError(
            f"The checkpoint in {directory} was saved by {saved_size} processes, but this run "
            f"has {world_size()}. Its RNG states and data positions are per process: load it "
            f"with num_processes={saved_size}."
        )
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{directory} has checkpoint format {manifest.get('format')}; this version of "
            f"notebook_kit reads format {FORMAT_VERSION}."
        )
    for kind, count in state.counts.items():
        saved = manifest["counts"].get(kind, 0)
        if saved != count:
            raise CheckpointError(
                f"The checkpoint in {directory} holds {saved} {kind}, but {count} were prepared "
                "(or registered) in this run; prepare the same objects as the run that saved it."
            )


def load_checkpoint(directory: str | os.PathLike[str], state: Stateful, process_index: int) -> None:
    """Restore ``state`` from a checkpoint written by :func:`save_checkpoint`.

    Example:
        >>> load_checkpoint("ckpt", Stateful(models=[model], optimizers=[optimizer]), 0)
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    _check_compatible(manifest, state, directory)
    staging = directory / manifest["folder"]
    for name, obj in state.shared_files().items():
        obj.load_state_dict(_load(staging / name))
    own = _load(staging / f"process_{process_index}.pt")
    for loader, loader_state in zip(state.dataloaders, own["dataloaders"], strict=True):
        loader.load_state_dict(loader_state)
    set_rng_states(own["rng"])
