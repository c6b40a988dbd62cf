"""The steps of a save on which every rank must agree before it goes on.

A step that touches the storage runs on each rank (within ``storage_timeout``, see
:func:`~notebook_kit.accelerator.storage.bounded`), then the ranks exchange how it went, so
that one rank's failure is raised on every rank instead of leaving the others waiting in the
next collective. :func:`check_shared` is the first such step of every save: it creates the
state folder and refuses one that is not the same folder for every rank.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from notebook_kit.accelerator.checkpoint_files import CheckpointError, CheckpointSaveError
from notebook_kit.accelerator.operations import broadcast_object, gather_object, world_size
from notebook_kit.accelerator.storage import (
    MissingRoot,
    StoragePath,
    bounded,
    is_local,
    make_folder,
    refresh,
)

__all__ = [
    "agree",
    "begin",
    "check_shared",
    "decided_by_rank_zero",
    "first_line",
]


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, at most 300 characters."""
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else ""


def begin(directory: StoragePath, which: str, rank: int, tidy: Callable[[], None]) -> str:
    """The new state folder's name, the same on every rank, once rank 0 ran ``tidy``: found
    the bucket, and removed what a killed save left (it takes no space from this one)."""

    def tidy_and_name() -> str:
        tidy()
        return f"state-{uuid.uuid4().hex[:12]}"

    return decided_by_rank_zero(directory, which, rank, tidy_and_name, "checking where to save")


def decided_by_rank_zero(
    directory: StoragePath, which: str, rank: int, call: Callable[[], Any], what: str
) -> Any:
    """``call()``'s value on rank 0 (within ``storage_timeout``), given to every rank.

    Raises (on every rank alike):
        CheckpointError: ``call`` refused the save (``CheckpointError``), or the bucket or
            container does not exist (a save never creates one).
        CheckpointSaveError: The storage failed or did not answer in time; on a disk, rank 0
            raises its own error instead.
    """
    value, problem, error_here = None, None, None
    if rank == 0:
        try:
            value = bounded(directory, call, f"{what} for {which}")
        except Exception as error:
            refused = isinstance(error, CheckpointError | MissingRoot)
            problem, error_here = (type(error).__name__, str(error), refused), error
    value, problem = broadcast_object((value, problem))
    if problem is None:
        return value
    kind, text, refused = problem
    if error_here is not None and (is_local(directory) or isinstance(error_here, CheckpointError)):
        raise error_here
    if refused:
        raise CheckpointError(f"Saving {which}: {text} Nothing was saved.") from error_here
    line = (text.strip().splitlines() or [""])[0][:300]
    raise CheckpointSaveError(
        f"Saving {which} failed on rank 0 while {what} ({kind}: {line}); nothing was written "
        "and the checkpoints saved before are intact. Fix the cause and call save_state() "
        "again."
    ) from error_here


def agree(directory: StoragePath, which: str, call: Callable[[], Any], what: str) -> Any:
    """``call()``'s value once every rank's call ended; if one failed, every rank raises.

    On a disk the failing rank raises its own error, as a disk's errors always were (a full
    disk becomes ``CheckpointSpaceError`` further up); elsewhere, and on the other ranks,
    :class:`CheckpointSaveError` names the save, the rank and the cause.
    """
    value, error = None, None
    try:
        value = bounded(directory, call, f"{what} for {which}")
    except Exception as raised:
        error = raised
    mine = None if error is None else f"{type(error).__name__}: {first_line(error)}"
    views = gather_object([mine]) if world_size() > 1 else [mine]
    failed = next(((rank, view) for rank, view in enumerate(views) if view), None)
    if failed is None:
        return value
    if error is not None and is_local(directory):
        raise error
    raise CheckpointSaveError(
        f"Saving {which} failed on rank {failed[0]} while {what} ({failed[1]}); nothing of "
        "it was kept and the checkpoints saved before are intact."
    ) from error


def check_shared(directory: StoragePath, staging: StoragePath, rank: int, which: str) -> None:
    """Create ``staging`` and refuse a folder that is not the same for every rank, before
    anything large is written.

    Each rank leaves a marker in the staging folder; once all have, each looks for
    everyone's. On a cluster, a local path is a different folder on each machine: a save
    would report success with its files spread over the machines, and no load could find
    them whole.

    Raises:
        CheckpointError: Some rank does not see the others' markers.
    """
    size = world_size()

    def mark() -> None:
        make_folder(staging)
        if size > 1:
            (staging / f".rank_{rank}").write_bytes(b"")

    agree(directory, which, mark, "creating its folder")  # also the barrier before looking
    if size == 1:
        return

    def look() -> list[int]:
        refresh(staging)
        seen = {path.name for path in staging.iterdir()}
        return [other for other in range(size) if f".rank_{other}" not in seen]

    missing = agree(directory, which, look, "listing its folder")
    blind = [(seer, absent) for seer, absent in gather_object([(rank, missing)]) if absent]
    if blind:
        seer, absent = blind[0]
        raise CheckpointError(
            f"save_state: {directory} is not one folder shared by every rank: rank {seer} "
            f"does not see what ranks {', '.join(map(str, absent))} wrote into it (they run "
            "on other machines, each with its own disk). Save to a URL every node reaches "
            "(s3://bucket/run, gs://..., az://...) or to a folder every node mounts (NFS, "
            "Lustre). Nothing was saved."
        )
