"""``memory_history=True`` through real launches and a real pool, on the CPU.

Refused before anything starts when the ranks would train on the CPU. The plumbing is run
anyway, in forked ranks, with the allocator stood in for (``tests/memory_snapshots.py``): the
ranks record, one raises ``torch.OutOfMemoryError``, and the kernel's error shows its note
under the traceback and names a snapshot that is on disk. ``tests/gpu/`` does it for real.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
import torch

from notebook_kit import WorkerError, WorkerPool, notebook_launcher
from notebook_kit.launch import plan as launch_plan
from notebook_kit.worker import memory_history
from tests.memory_snapshots import snapshot

pytestmark = pytest.mark.integration
_SNAPSHOT = re.compile(r"Snapshot of its allocations: (\S+) \(open it at https://pytorch.org/")


def _mark_and_return(path: str) -> int:
    Path(path).touch()
    return 1


@pytest.mark.parametrize("processes", [1, 2])
def test_memory_history_on_the_cpu_is_refused_before_anything_starts(tmp_path, processes):
    marker = tmp_path / "ran"
    with pytest.raises(ValueError, match=r"memory_history=True needs CUDA GPUs.*leave memory_h"):
        notebook_launcher(
            _mark_and_return, args=(str(marker),), num_processes=processes, memory_history=True
        )
    with pytest.raises(ValueError, match="memory_history=True needs CUDA GPUs"):
        WorkerPool(num_processes=2, memory_history=True, live=False)
    assert not marker.exists()


@pytest.fixture
def recorded(monkeypatch):
    """Ranks forked from here record as GPU ranks would, with torch's allocator stood in for."""
    monkeypatch.setattr(launch_plan, "check_memory_history", lambda *args: None)
    monkeypatch.setattr(memory_history, "records", lambda enabled, device: enabled)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: None)
    taken = snapshot(__file__, _BIG_LINE, _BIG_LINE + 1)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: taken)
    return taken


def _runs_out_on_rank_1(meet: bool = True) -> None:
    if torch.distributed.get_rank() == 1:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 MiB.")
    if meet:  # a launch's other rank is stopped where it waits
        torch.distributed.barrier()


_BIG_LINE = _runs_out_on_rank_1.__code__.co_firstlineno + 2  # the raise, as the allocating line


def _snapshot_named_in(text: str) -> Path:
    found = _SNAPSHOT.search(text)
    assert found, text
    return Path(found.group(1))


def test_a_launched_rank_out_of_memory_shows_its_allocations_under_its_traceback(recorded):
    with pytest.raises(WorkerError) as raised:
        notebook_launcher(_runs_out_on_rank_1, num_processes=2, memory_history=True, live=False)
    text = str(raised.value)
    assert raised.value.rank == 1
    traceback = text[text.index("Traceback of rank 1:") :]
    below = traceback[traceback.index("torch.OutOfMemoryError: CUDA out of memory") :]
    assert "Rank 1 ran out of GPU memory holding 608.00 MiB in live tensors" in below
    assert f"{__file__}:{_BIG_LINE} in train" in below  # the line that made the largest blocks
    path = _snapshot_named_in(below)
    assert path.name == "rank1.pickle" and pickle.loads(path.read_bytes()) == recorded


def test_a_pool_commands_out_of_memory_shows_its_allocations_and_the_pool_goes_on(recorded):
    with WorkerPool(num_processes=2, memory_history=True, live=False) as pool:
        with pytest.raises(WorkerError) as raised:
            pool.run(_runs_out_on_rank_1, False)
        assert "Largest live allocations, by the line that made them:" in str(raised.value)
        assert _snapshot_named_in(str(raised.value)).exists()
        assert pool.run(lambda: torch.distributed.get_rank(), ranks="all") == [0, 1]


def _runs_out() -> None:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 MiB.")


def test_a_run_in_the_kernel_raises_the_error_itself_with_its_allocations_noted(recorded):
    with pytest.raises(torch.OutOfMemoryError) as raised:
        notebook_launcher(_runs_out, num_processes=1, memory_history=True, live=False)
    (note,) = raised.value.__notes__  # printed under the traceback, where %debug still works
    assert note.startswith("Rank 0 ran out of GPU memory holding 608.00 MiB in live tensors")
    assert pickle.loads(_snapshot_named_in(note).read_bytes()) == recorded
