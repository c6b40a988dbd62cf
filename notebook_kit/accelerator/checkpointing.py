"""Training checkpoints that are all-or-nothing.

A checkpoint directory holds a ``checkpoint.json`` manifest and one ``state-<id>/`` folder of
files. A save writes a fresh folder, waits until every process has written its part, and only
then replaces the manifest with one ``os.replace``: that rename is the commit. A crash at any
earlier moment leaves the previous manifest pointing at the previous, untouched folder.

Nothing a failed save wrote is kept: a save that raises (a full disk, an interrupt) removes
its folder before the error goes up, and every save first removes the folders that no
manifest names (what a killed save left), so a failure never takes the space later saves
need. A full disk raises :class:`CheckpointSpaceError` saying which save, where and how much
it needed.

Rank 0 writes models, optimizers, schedulers, the GradScaler and registered objects (they are
identical on every rank); every rank writes its own RNG states and data-loader positions.
Sharded models and optimizers (FSDP) are a ``sharded`` part instead: every rank writes its
share into the same staging folder before the commit, so they are committed atomically too.
Everything is read back with ``torch.load(weights_only=True)``, and a damaged or edited file
raises :class:`CheckpointError` naming it (see :mod:`~notebook_kit.accelerator.checkpoint_files`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch

from notebook_kit.accelerator.async_save import BackgroundSaves, SaveAbandoned
from notebook_kit.accelerator.checkpoint_files import (
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
    CheckpointSaveError,
    CheckpointSpaceError,
    is_state_folder,
    load_file,
    read_manifest,
    space_errno,
    state_folder,
    tensor_bytes,
    write_file,
)
from notebook_kit.accelerator.operations import broadcast_object, gather_object, world_size
from notebook_kit.accelerator.save_agreement import (
    begin,
    check_shared,
    first_line,
)
from notebook_kit.accelerator.storage import (
    StoragePath,
    bounded,
    check_root,
    free_space,
    is_local,
    refresh,
    remove_tree,
    storage_path,
    write_whole,
)
from notebook_kit.runtime.seeding import get_rng_states, set_rng_states

__all__ = [
    "MANIFEST",
    "CheckpointError",
    "CheckpointSaveError",
    "CheckpointSpaceError",
    "Stateful",
    "load_checkpoint",
    "read_manifest",
    "remove_unreferenced",
    "save_checkpoint",
]

_FILE_OVERHEAD = 4096  # bytes a torch.save file takes beyond its tensors, roughly


@dataclass
class Stateful:
    """What a checkpoint covers, as lists of objects with ``state_dict``/``load_state_dict``."""

    models: Sequence[torch.nn.Module] = ()
    optimizers: Sequence[Any] = ()
    schedulers: Sequence[Any] = ()
    dataloaders: Sequence[Any] = ()
    custom: Sequence[Any] = ()
    scaler: Any = None
    sharded: Any = None  # counts, state_dicts(), write(folder, states, group), load(folder)
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
        if self.sharded is not None:
            self.counts |= self.sharded.counts

    def shared_files(self) -> dict[str, Any]:
        """File name -> object, for the objects every rank holds identically."""
        files = {f"model_{i}.pt": m for i, m in enumerate(self.models)}
        files |= {f"optimizer_{i}.pt": o for i, o in enumerate(self.optimizers)}
        files |= {f"scheduler_{i}.pt": s for i, s in enumerate(self.schedulers)}
        files |= {f"custom_{i}.pt": c for i, c in enumerate(self.custom)}
        if self.scaler is not None:
            files["scaler.pt"] = self.scaler
        return files

    def own_state(self) -> dict[str, Any]:
        """What only this process holds: its RNG states and data-loader positions."""
        return {
            "rng": get_rng_states(),
            "dataloaders": [loader.state_dict() for loader in self.dataloaders],
        }


def _commit(directory: StoragePath, manifest: dict[str, Any]) -> None:
    write_whole(directory / MANIFEST, json.dumps(manifest, indent=2).encode())


def remove_unreferenced(directory: StoragePath, keep: str | None = None) -> None:
    """Remove the state folders of ``directory`` that its manifest does not name.

    They are what a failed or killed save left, or the previous checkpoint once a newer one
    is committed (``keep``). Nothing is removed while the manifest cannot be read: then which
    folder is current is unknown.
    """
    refresh(directory)
    if not directory.is_dir():
        return
    if keep is None and (directory / MANIFEST).exists():
        try:
            keep = read_manifest(directory)["folder"]
        except (OSError, CheckpointError):
            return
    for path in directory.iterdir():
        if is_state_folder(path.name) and path.name != keep and not path.is_symlink():
            remove_tree(path)
        elif path.name.startswith(f".{MANIFEST}."):  # a manifest write cut short
            path.unlink(missing_ok=True)


def save_checkpoint(
    directory: str | os.PathLike[str] | StoragePath,
    state: Stateful,
    process_index: int,
    number: int | None = None,
    *,
    background: BackgroundSaves | None = None,
    after_commit: Callable[[], None] | None = None,
) -> StoragePath:
    """Write ``state`` into ``directory`` atomically; collective over all processes.

    ``number`` (of a numbered ``checkpoint_<n>``) only appears in error messages;
    ``after_commit`` runs on rank 0 once the manifest is written. With ``background`` the
    state is copied to host memory and written by its thread (the asynchronous save): what
    is checked and the commit are the same, only where and when the files are written differ.

    Raises:
        CheckpointSpaceError: The disk filled up; the partial save was removed.
        CheckpointSaveError: Another rank could not write its part; nothing was kept.

    Example::

        save_checkpoint("ckpt", Stateful(models=[model], optimizers=[optimizer]), 0)
    """
    directory = storage_path(directory)
    which = _which(directory, number)
    created = is_local(directory) and not directory.exists()  # before any rank makes it
    folder = begin(directory, which, process_index, lambda: _tidy(directory))
    job = _Save(directory, folder, process_index)
    job.created, job.number = created, number
    group, stop = None, None  # a blocking save: the training group, never abandoned
    try:
        job.check_shared()
        files, sharded = job.snapshot(state)
        if background is not None:
            group, stop = background.process_group(), background.abandoned
            files, sharded = background.staging.copy((files, sharded))
    except BaseException as error:
        job.fail(error)

    def write() -> None:
        job.write(files, sharded, group, stop)
        if after_commit is not None and process_index == 0:
            after_commit()

    if background is None:
        write()
    else:
        background.start(write, job.which)
    return directory


def _tidy(directory: StoragePath) -> None:
    check_root(directory)
    remove_unreferenced(directory)


def _which(directory: StoragePath, number: int | None) -> str:
    return f"{'checkpoint' if number is None else f'checkpoint {number}'} ({directory})"


class _Save:
    """One save into ``directory/folder``: what it writes, its commit, and its cleanup."""

    def __init__(self, directory: StoragePath, folder: str, process_index: int) -> None:
        self.directory, self.folder, self.rank = directory, folder, process_index
        self.staging = directory / folder
        self.created = False
        self.private = False  # the folder is not the same for every rank: each removes its own
        self.number: int | None = None
        self.counts: dict[str, int] = {}
        self.sharded: Any = None
        self.needed = 0

    @property
    def which(self) -> str:
        return _which(self.directory, self.number)

    def snapshot(self, state: Stateful) -> tuple[dict[str, Any], dict[str, Any]]:
        """The state dicts this rank writes (file name -> state) and its sharded part's."""
        shared = {name: obj.state_dict() for name, obj in state.shared_files().items()}
        own = state.own_state()
        self.counts, self.sharded = state.counts, state.sharded
        self.needed = tensor_bytes(shared) + world_size() * tensor_bytes(own)
        self.needed += (len(shared) + world_size()) * _FILE_OVERHEAD
        files = shared if self.rank == 0 else {}
        files = files | {f"process_{self.rank}.pt": own}
        sharded = state.sharded.state_dicts() if state.sharded is not None else {}
        return files, sharded

    def write(self, files: dict[str, Any], sharded: dict[str, Any], group: Any, stop: Any) -> None:
        """Write every rank's files, then commit once all succeeded (``group``: where the
        ranks agree; ``stop``: an event that abandons the save before its next file)."""
        failure: BaseException | None = None
        try:
            if self.sharded is not None:
                self.sharded.write(self.staging, sharded, group)  # raises on every rank alike
            what = f"writing rank {self.rank}'s files"
            bounded(self.directory, lambda: self._write_files(files, stop), what)
        except (KeyboardInterrupt, SystemExit):
            self._discard()
            raise
        except BaseException as error:  # torch's CheckpointException is a BaseException
            failure = error
        failed = _first_failure(failure, group)
        if failed is None and self.rank == 0:
            try:
                manifest = self._manifest()
                bounded(self.directory, lambda: _commit(self.directory, manifest), "committing")
            except Exception as error:
                failure, failed = error, (0, f"{type(error).__name__}: {first_line(error)}")
        failed = broadcast_object(failed, group=group)  # every rank: was it committed?
        if failed is not None:
            self._discard()
            if failure is not None and (is_local(self.directory) or space_errno(failure)):
                self.fail(failure, discarded=True)  # a disk's own error, as it was raised
            rank, reason = failed
            raise CheckpointSaveError(
                f"Saving {self.which} failed on rank {rank} ({reason}), so nothing of it was "
                "kept and the checkpoints saved before are intact."
            ) from failure
        if self.rank == 0:
            with contextlib.suppress(Exception):  # saved; the next save removes what is left
                keep = self.folder
                what = "removing the previous state"
                bounded(self.directory, lambda: remove_unreferenced(self.directory, keep), what)

    def _write_files(self, files: dict[str, Any], stop: Any) -> None:
        for name, state in files.items():
            _check_abandoned(stop, self.rank)
            write_file(state, self.staging / name)
        _check_abandoned(stop, self.rank)  # abandoned while its last file was written

    def _manifest(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "folder": self.folder,
            "world_size": world_size(),
            "counts": self.counts,
        }

    def fail(self, error: BaseException, discarded: bool = False) -> NoReturn:
        """Raise ``error`` (a full disk explained) once the partial save is removed."""
        if not discarded:
            self._discard()
        code = space_errno(error)
        if code is None:
            raise error
        free = free_space(self.directory)
        raise CheckpointSpaceError(
            code,
            f"No space left on device while saving {self.which.rsplit(' (', 1)[0]} to "
            f"{self.directory} (needed ≈ {_megabytes(self.needed)}"
            f"{'' if free is None else f', {_megabytes(free)} free'}). The "
            "partial save was removed and checkpoints saved before are intact: free some "
            "space (or save elsewhere, or keep fewer with ProjectConfiguration(total_limit="
            "...)) and call save_state() again.",
        ) from error

    def _discard(self) -> None:
        """Remove what the save wrote. Rank 0 owns the folder; others only their own files,
        since rank 0 may still be writing into it, or, when each rank sees a folder of its
        own, that folder. Storage that fails again leaves it to the next save."""
        with contextlib.suppress(Exception):
            bounded(self.directory, self._remove_own, "removing the failed save")

    def _remove_own(self) -> None:
        if self.rank != 0 and not self.private:
            for name in (f"process_{self.rank}.pt", f".rank_{self.rank}"):
                with contextlib.suppress(FileNotFoundError):
                    (self.staging / name).unlink()
            return
        remove_tree(self.staging)
        if self.created and is_local(self.directory):
            with contextlib.suppress(OSError):
                self.directory.rmdir()  # only if the failed save left it empty

    def check_shared(self) -> None:
        """Create the state folder, the same one for every rank (see :func:`check_shared`)."""
        try:
            check_shared(self.directory, self.staging, self.rank, self.which)
        except CheckpointError:  # each rank sees a folder of its own
            self.private = True
            raise


def _first_failure(failure: BaseException | None, group: Any) -> tuple[int, str] | None:
    """``(rank, reason)`` of the first rank whose files failed, the same on every rank; it
    also means every rank is done writing."""
    mine = None if failure is None else f"{type(failure).__name__}: {first_line(failure)}"
    views = gather_object([mine], group=group)
    return next(((rank, reason) for rank, reason in enumerate(views) if reason), None)


def _check_abandoned(stop: Any, rank: int) -> None:
    if stop is not None and stop.is_set():
        raise SaveAbandoned(f"rank {rank} abandoned the save")


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size < 100e6 else f"{size / 1e6:,.0f} MB"


def _check_compatible(manifest: dict[str, Any], state: Stateful, directory: StoragePath) -> None:
    for kind, count in state.counts.items():
        saved = manifest["counts"].get(kind, 0)
        if saved != count:
            raise CheckpointError(
                f"The checkpoint in {directory} holds {saved} {kind}, but {count} were prepared "
                "(or registered) in this run; prepare the same objects as the run that saved it."
            )


def _restore(obj: Any, path: StoragePath) -> None:
    saved = load_file(path)
    try:
        obj.load_state_dict(saved)
    except Exception as error:
        raise CheckpointError(
            f"{path} does not fit the {type(obj).__name__} of this run "
            f"({type(error).__name__}: {first_line(error)}); prepare the same objects as the "
            "run that saved it."
        ) from error


def _own_file(path: StoragePath) -> dict[str, Any]:
    own = load_file(path)
    loaders = own.get("dataloaders") if isinstance(own, dict) else None
    if not isinstance(loaders, list) or not isinstance(own.get("rng"), dict):
        raise CheckpointError(
            f"{path} does not hold RNG states and data positions as save_state writes them; "
            "it was damaged or replaced: load an earlier checkpoint, or save a new one."
        )
    return own


def _restore_own(state: Stateful, staging: StoragePath, saved_size: int, rank: int) -> None:
    """This process's RNG states and data positions.

    Saved by as many processes, each gets its own back. Saved by another number, the data
    positions come from process 0's file (a prepared loader turns them into the global batch
    every process had reached) and the RNG states from this rank's file where it has one; a
    rank beyond those keeps the states its launch seeded.
    """
    same = saved_size == world_size()
    path = staging / f"process_{rank if same else 0}.pt"
    own = _own_file(path)
    rng = own["rng"]
    if not same and rank != 0:
        rng = _own_file(staging / f"process_{rank}.pt")["rng"] if rank < saved_size else None
    try:
        for loader, loader_state in zip(state.dataloaders, own["dataloaders"], strict=True):
            loader.load_state_dict(loader_state)
        if rng is not None:
            set_rng_states(rng)
    except CheckpointError:
        raise
    except Exception as error:
        raise CheckpointError(
            f"{path} holds unusable RNG states or data positions ({type(error).__name__}: "
            f"{error}); it was damaged or replaced: load an earlier checkpoint, or save a new one."
        ) from error


def load_checkpoint(
    directory: str | os.PathLike[str] | StoragePath, state: Stateful, process_index: int
) -> None:
    """Restore ``state`` from a checkpoint written by :func:`save_checkpoint`.

    Raises:
        FileNotFoundError: No checkpoint, or a file of it, at ``directory``.
        CheckpointError: A damaged file (named), or saved with other processes or objects.

    Example::

        load_checkpoint("ckpt", Stateful(models=[model], optimizers=[optimizer]), 0)
    """
    directory = storage_path(directory, name="input_dir")
    manifest = read_manifest(directory)
    _check_compatible(manifest, state, directory)
    staging = state_folder(directory, manifest)
    for name, obj in state.shared_files().items():
        _restore(obj, staging / name)
    if state.sharded is not None:
        state.sharded.load(staging)
    _restore_own(state, staging, manifest["world_size"], process_index)
