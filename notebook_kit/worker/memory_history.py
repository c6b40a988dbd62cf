"""``memory_history=True`` on a GPU rank: the allocator's history, and a snapshot on out-of-memory.

While the user's code runs, torch records every CUDA allocation with the Python stack that made
it (``torch.cuda.memory._record_memory_history``). When that code raises
``torch.OutOfMemoryError``, the rank saves the allocator's snapshot (the pickle
``torch.cuda.memory._dump_snapshot`` writes, read by pytorch.org/memory_viz) in the run's
folder, and adds a note to the exception: the largest live allocations with the line that made
each, and the snapshot's path. Python prints an exception's notes under it, so the note reaches
the rank's traceback in the kernel (the ``WorkerError`` text, the cell) unchanged: through a
forked rank's failure message, a pool's answer, a cluster node's relay, or the kernel's own
traceback when the run is the kernel itself.

The recording is the process's, as torch's allocator is: one at a time, ended on the way out.
"""

from __future__ import annotations

import contextlib
import pickle
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from notebook_kit.atomic_file import replace_atomically
from notebook_kit.worker.memory_summary import describe_snapshot

__all__ = ["note_out_of_memory", "recording_memory", "records", "run_folder"]

# Allocation events kept (a ring): memory_viz's timeline of the run up to the failure, at a
# bounded cost in host memory (each entry holds a stack).
MAX_ENTRIES = 100_000
_NOTED = "_notebook_kit_memory_noted"  # set on an exception once its note is added


@dataclass(frozen=True)
class _Recording:
    folder: Path
    rank: int


_recording: list[_Recording] = []  # this process's recording, as torch's allocator's is


def run_folder(run: str) -> Path:
    """Where one run's snapshots go: a folder of the machine's temporary directory.

    Example:
        >>> run_folder("launch-41").parts[-2:]
        ('notebook_kit_memory', 'launch-41')
    """
    return Path(tempfile.gettempdir()) / "notebook_kit_memory" / run


def records(enabled: bool, device: str) -> bool:
    """Whether a rank records: asked to, and on a GPU (a launch on the CPU refuses it).

    Example:
        >>> records(True, "cpu")
        False
    """
    return enabled and device == "cuda"


@contextlib.contextmanager
def recording_memory(enabled: bool, rank: int, device: str, folder: Path) -> Iterator[None]:
    """Record the CUDA allocator's history over the block when ``enabled`` on a ``"cuda"``
    rank; an out-of-memory error leaving the block carries its note (:func:`note_out_of_memory`).
    """
    if not records(enabled, device) or _recording:  # an outer block already records
        yield
        return
    # Python frames only: C++ frames would be symbolised at the snapshot, which takes minutes.
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    _recording.append(_Recording(folder, rank))
    try:
        yield
    except BaseException as error:
        note_out_of_memory(error)
        raise
    finally:
        _recording.pop()
        with contextlib.suppress(Exception):
            torch.cuda.memory._record_memory_history(enabled=None)


def note_out_of_memory(error: BaseException) -> None:
    """When ``error`` is (or was caused by) ``torch.OutOfMemoryError`` and this rank records
    its memory: save the snapshot and add the note naming the largest allocations (once)."""
    if not _recording or getattr(error, _NOTED, False) or not _ran_out(error):
        return
    recording = _recording[-1]
    try:
        snapshot = torch.cuda.memory._snapshot()
        path = _free_name(recording.folder, recording.rank)
        replace_atomically(path, lambda file: pickle.dump(snapshot, file))
        note = describe_snapshot(snapshot, str(path), recording.rank)
    except Exception as failed:  # the failure itself must still reach the kernel
        problem = f"{type(failed).__name__}: {failed}"
        note = f"memory_history: rank {recording.rank} could not save its snapshot ({problem})."
    error.add_note(note)
    setattr(error, _NOTED, True)


def _ran_out(error: BaseException | None) -> bool:
    """Whether ``error`` or an exception it was raised from or during is an out-of-memory."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, torch.OutOfMemoryError):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _free_name(folder: Path, rank: int) -> Path:
    """``rank<N>.pickle`` in ``folder`` (made), or ``rank<N>-2.pickle``... when a pool's earlier
    command already left one."""
    folder.mkdir(parents=True, exist_ok=True)
    path, number = folder / f"rank{rank}.pickle", 1
    while path.exists():
        number += 1
        path = folder / f"rank{rank}-{number}.pickle"
    return path
