"""The files of a checkpoint, read and written defensively.

What :mod:`notebook_kit.accelerator.checkpointing` builds on: the manifest's name and format,
``write_file`` (a ``torch.save`` that reaches the disk), ``read_manifest`` and ``load_file``,
which turn every way a checkpoint can be damaged or edited into a :class:`CheckpointError`
naming the file and what is wrong, and the diagnosis of a save that ran out of disk space.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Mapping
from typing import Any

import torch

from notebook_kit.accelerator.storage import (
    StoragePath,
    dcp_reader,
    is_local,
    refresh,
    storage_path,
    write_durably,
)

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "CheckpointError",
    "CheckpointSaveError",
    "CheckpointSpaceError",
    "is_state_folder",
    "load_file",
    "read_manifest",
    "sharded_load_error",
    "space_errno",
    "state_folder",
    "tensor_bytes",
    "write_file",
]

MANIFEST = "checkpoint.json"
FORMAT_VERSION = 1
_STATE_FOLDER = re.compile(r"state-[0-9a-f]{1,64}")
_MANIFEST_FIELDS = {"format": int, "folder": str, "world_size": int, "counts": dict}
_DAMAGED = "load an earlier checkpoint, or save a new one"


class CheckpointError(ValueError):
    """A checkpoint exists but cannot be loaded into this run: damaged, or saved differently."""


class CheckpointSaveError(RuntimeError):
    """A save failed where no exception could reach the caller at once: in the background
    (``save_state(async_save=True)``) or on another rank. Nothing of it was kept.

    Example::

        try:
            accelerator.save_state(async_save=True)
        except CheckpointSaveError as error:
            print(error)  # The asynchronous save_state of checkpoint 3 (...) failed ...
    """


class CheckpointSpaceError(OSError):
    """The disk filled up during ``save_state``; the partial save was removed.

    An ``OSError`` with ``errno`` ENOSPC (or EDQUOT), so existing handlers still catch it.

    Example::

        try:
            accelerator.save_state()
        except CheckpointSpaceError as error:
            print(error)  # No space left on device while saving checkpoint 3 to ...
    """

    def __str__(self) -> str:
        return str(self.strerror)


def is_state_folder(name: str) -> bool:
    """Whether ``name`` is a state folder name that a save writes (``state-<hex id>``)."""
    return _STATE_FOLDER.fullmatch(name) is not None


def write_file(obj: Any, path: StoragePath) -> None:
    """``torch.save`` that reaches the storage before returning (a later commit depends on it)."""
    write_durably(path, lambda handle: torch.save(obj, handle))


def read_manifest(directory: str | os.PathLike[str] | StoragePath) -> dict[str, Any]:
    """The committed manifest of ``directory``, checked before anything it names is opened.

    Raises:
        FileNotFoundError: No directory, or no save into it ever completed.
        CheckpointError: The manifest is damaged, from another format, or names a folder
            outside the checkpoint.

    Example::

        read_manifest("ckpt")["world_size"]
        # 2
    """
    directory = storage_path(directory, name="input_dir")
    refresh(directory)  # another process (or machine) may have committed it just now
    if not directory.is_dir():
        raise FileNotFoundError(f"No checkpoint directory at {directory}.")
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{directory} holds no {MANIFEST}: it was not written by save_state, or no save "
            "into it ever completed."
        )
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:  # JSONDecodeError and UnicodeDecodeError included
        raise CheckpointError(f"{path} cannot be read ({error}); {_DAMAGED}.") from error
    _check_manifest(manifest, path)
    return manifest


def state_folder(directory: StoragePath, manifest: dict[str, Any]) -> StoragePath:
    """The state folder ``manifest`` names, checked to be there.

    Raises:
        CheckpointError: It is missing (removed by hand, or by another run's save).
    """
    staging = directory / manifest["folder"]
    if not staging.is_dir():
        raise CheckpointError(
            f"{directory / MANIFEST} names the state folder {manifest['folder']}, which is "
            "missing: it was removed after the save (by hand, or by another run saving into "
            "the same folder). Load an earlier checkpoint, or save a new one."
        )
    return staging


def _check_manifest(manifest: Any, path: StoragePath) -> None:
    if not isinstance(manifest, dict):
        raise CheckpointError(
            f"{path} holds a JSON {type(manifest).__name__}, not the object save_state writes; "
            f"it was damaged or replaced: {_DAMAGED}."
        )
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format {manifest.get('format')!r}; this version of "
            f"notebook_kit reads format {FORMAT_VERSION}."
        )
    for key, kind in _MANIFEST_FIELDS.items():
        value = manifest.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CheckpointError(
                f"{path} has {key!r} = {value!r}, not a {kind.__name__}; it was damaged or "
                f"edited: {_DAMAGED}."
            )
    counts = manifest["counts"]
    if not all(isinstance(count, int) and count >= 0 for count in counts.values()):
        raise CheckpointError(f"{path} has invalid 'counts' {counts!r}; {_DAMAGED}.")
    folder = manifest["folder"]
    if not is_state_folder(folder) or (path.parent / folder).is_symlink():
        raise CheckpointError(
            f"{path} names the state folder {folder!r}, which is not a state-<id> folder "
            f"inside {path.parent}; notebook_kit never reads outside the checkpoint. The "
            f"manifest was edited or damaged: {_DAMAGED}."
        )


def load_file(path: StoragePath) -> Any:
    """``torch.load(weights_only=True)`` of one checkpoint file, failures named and explained.

    Example::

        load_file(Path("ckpt/state-0a1b/model_0.pt"))["weight"].shape
        # torch.Size([1, 2])
    """
    if not path.is_file():
        raise FileNotFoundError(
            f"Checkpoint file {path} is missing; the checkpoint was modified after it was saved."
        )
    try:
        if is_local(path):
            return torch.load(path, map_location="cpu", weights_only=True)
        with path.open("rb") as handle:
            return torch.load(handle, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises a different type for each kind of damage
        raise CheckpointError(
            f"Checkpoint file {path} cannot be read: {_load_failure(error, path)}; {_DAMAGED}."
        ) from error


def _load_failure(error: Exception, path: StoragePath) -> str:
    text = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    if "Weights only load failed" in text:
        return (
            "it holds pickled objects other than tensors and plain containers, which are "
            f"never executed ({text})"
        )
    if isinstance(error, EOFError):
        return "it is empty" if path.stat().st_size == 0 else "it ends early (truncated)"
    return f"it is damaged or not a file save_state wrote ({type(error).__name__}: {text})"


def sharded_load_error(error: BaseException, folder: StoragePath) -> CheckpointError:
    """What torch's ``CheckpointException`` from loading the DCP ``folder`` means, as a
    :class:`CheckpointError` naming the file at fault.

    The exception holds one failure per rank that could not read its part. A shard file that
    is missing or shorter than its index (``.metadata``) says is named from the index; any
    other failure by its rank and first line.
    """
    damage = _damaged_shard(folder)
    if damage:
        return CheckpointError(
            f"Sharded checkpoint file {damage}, so the sharded checkpoint {folder} is damaged; "
            f"{_DAMAGED}."
        )
    failures = getattr(error, "failures", None) or {}
    failure, rank = (
        (failures[min(failures)][0], f"rank {min(failures)}: ") if failures else (error, "")
    )
    name = getattr(failure, "filename", None)
    where = f"file {name}" if name else folder
    line = (str(failure).strip().splitlines() or [""])[0][:200]
    return CheckpointError(
        f"Sharded checkpoint {where} cannot be read ({rank}{type(failure).__name__}: {line}); "
        f"{_DAMAGED}."
    )


def _damaged_shard(folder: StoragePath) -> str | None:
    """The first shard of ``folder`` that is missing or cut short, said as such, or None."""
    try:
        stored = dcp_reader(folder).read_metadata().storage_data
    except Exception:  # an unreadable index: the caller reports the failure itself
        return None
    ends: dict[str, int] = {}
    for info in stored.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for relative, end in sorted(ends.items()):
        path = folder / relative
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size < end:
            size = path.stat().st_size
            return f"{path} ends early (truncated: {size} of {end} bytes)"
    return None


def space_errno(error: BaseException) -> int | None:
    """ENOSPC or EDQUOT if ``error`` (or what it was raised from) is a full disk, else None.

    torch reports a failed write as ``RuntimeError: [enforce fail at inline_container.cc]``;
    the OSError that says why is in its context.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return current.errno
        current = current.__cause__ or current.__context__
    return None


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested state dict: what a save of it needs, roughly."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(tensor_bytes(value) for value in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(value) for value in obj)
    return 0
