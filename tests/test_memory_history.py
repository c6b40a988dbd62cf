"""Memory on out-of-memory, without a GPU: the summary of a snapshot written as torch writes
them, and the note a raised ``torch.OutOfMemoryError`` gets while a rank records."""

from __future__ import annotations

import pickle

import pytest
import torch

from notebook_kit.worker import memory_history
from notebook_kit.worker.memory_summary import describe_snapshot, largest_allocations, made_by
from tests.memory_snapshots import TORCH, MiB, frame, snapshot

BIG_LINE = 20  # lines of this file the stand-in snapshot names as the allocating ones
SMALL_LINE = 21


def _snapshot() -> dict:
    return snapshot(__file__, BIG_LINE, SMALL_LINE)


def _source(line: int) -> str:
    with open(__file__) as source:
        return source.read().splitlines()[line - 1].strip()


def test_live_blocks_are_summed_by_the_user_line_that_made_them_largest_first():
    found = largest_allocations(_snapshot())
    assert [(a.size, a.count) for a in found] == [(512 * MiB, 2), (96 * MiB, 1)]
    # The user's line, not torch's Linear inside which the tensors were made.
    assert found[0].where == f"{__file__}:{BIG_LINE} in train: {_source(BIG_LINE)}"
    assert found[1].where.startswith(f"{__file__}:{SMALL_LINE} in train")


def test_freed_and_awaiting_blocks_are_not_live_and_top_limits_the_lines():
    found = largest_allocations(_snapshot(), top=1)
    assert len(found) == 1 and found[0].size == 512 * MiB


def test_a_block_made_only_inside_torch_names_torchs_line_and_one_without_frames_says_so():
    inside = [frame(f"{TORCH}/nn/modules/linear.py", 125, "forward")]
    assert made_by(inside).startswith(f"{TORCH}/nn/modules/linear.py:125 in forward")
    assert made_by([]) == "allocated before the history was recorded"


def test_the_description_names_the_totals_the_lines_and_where_the_snapshot_is():
    text = describe_snapshot(_snapshot(), "/runs/rank1.pickle", 1)
    lines = text.splitlines()
    assert lines[0] == (
        "Rank 1 ran out of GPU memory holding 608.00 MiB in live tensors (704.00 MiB reserved)."
    )
    assert lines[1] == "Largest live allocations, by the line that made them:"
    assert "512.00 MiB in   2 blocks" in lines[2] and f":{BIG_LINE} in train" in lines[2]
    assert "96.00 MiB in   1 block" in lines[3]
    assert lines[-1] == (
        "Snapshot of its allocations: /runs/rank1.pickle "
        "(open it at https://pytorch.org/memory_viz)"
    )


@pytest.fixture
def allocator(monkeypatch):
    """torch's allocator history stood in for: what was asked of it, and the snapshot it gives."""
    calls: list[dict] = []
    monkeypatch.setattr(memory_history, "records", lambda enabled, device: enabled)
    monkeypatch.setattr(
        torch.cuda.memory, "_record_memory_history", lambda *a, **k: calls.append(k)
    )
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", _snapshot)
    return calls


def _run_out(tmp_path, error: BaseException, enabled: bool = True) -> BaseException:
    recording = memory_history.recording_memory(enabled, 3, "cuda", tmp_path / "run")
    with pytest.raises(type(error)) as raised, recording:
        raise error
    return raised.value


def test_an_out_of_memory_error_saves_the_snapshot_and_carries_the_note(tmp_path, allocator):
    error = _run_out(tmp_path, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    path = tmp_path / "run" / "rank3.pickle"
    assert pickle.loads(path.read_bytes()) == _snapshot()  # what memory_viz reads
    (note,) = error.__notes__
    assert note == describe_snapshot(_snapshot(), str(path), 3)
    # Recording started with Python stacks and a bounded history, and ended with the block.
    assert allocator == [
        {"max_entries": memory_history.MAX_ENTRIES, "stacks": "python"},
        {"enabled": None},
    ]


def test_an_error_raised_from_an_out_of_memory_error_carries_the_note_too(tmp_path, allocator):
    try:
        raise torch.OutOfMemoryError("CUDA out of memory")
    except torch.OutOfMemoryError as oom:
        wrapped = RuntimeError("the step failed")
        wrapped.__cause__ = oom
    error = _run_out(tmp_path, wrapped)
    assert "Largest live allocations" in error.__notes__[0]


def test_other_errors_and_a_rank_that_does_not_record_get_no_note(tmp_path, allocator):
    assert not hasattr(_run_out(tmp_path, ValueError("bad")), "__notes__")
    error = _run_out(tmp_path, torch.OutOfMemoryError("CUDA out of memory"), enabled=False)
    assert not hasattr(error, "__notes__")
    assert allocator == [
        {"max_entries": memory_history.MAX_ENTRIES, "stacks": "python"},
        {"enabled": None},
    ]  # only the first block recorded
    assert not (tmp_path / "run").exists()


def test_a_second_out_of_memory_of_a_pool_worker_gets_its_own_file_and_one_note(
    tmp_path, allocator
):
    with memory_history.recording_memory(True, 0, "cuda", tmp_path):
        for _ in range(2):
            error = torch.OutOfMemoryError("CUDA out of memory")
            memory_history.note_out_of_memory(error)
            memory_history.note_out_of_memory(error)  # the answer's path and the block's
            assert len(error.__notes__) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0-2.pickle", "rank0.pickle"]


def test_a_snapshot_that_cannot_be_saved_is_said_and_the_failure_still_goes(tmp_path, allocator):
    (tmp_path / "run").write_text("a file where the folder would go")
    error = _run_out(tmp_path, torch.OutOfMemoryError("CUDA out of memory"))
    assert error.__notes__[0].startswith("memory_history: rank 3 could not save its snapshot (")


def test_a_cluster_run_is_refused_before_any_node_starts_when_a_nodes_ranks_are_on_the_cpu():
    from notebook_kit import LaunchConfig
    from notebook_kit.launch.cluster.cluster_plan import check_cluster_mesh
    from notebook_kit.node.protocol import NodeSettings
    from tests.test_parallelism import _probed

    settings = NodeSettings(LaunchConfig(memory_history=True, num_processes=2), 300.0, None)
    check_cluster_mesh(settings, [_probed(2), _probed(2)])  # every rank on its own GPU
    with pytest.raises(ValueError, match=r"memory_history=True needs CUDA GPUs.*leave memory"):
        check_cluster_mesh(settings, [_probed(2), _probed(1)])  # node 1's ranks: on the CPU


def test_notebook_kit_launch_of_a_script_refuses_memory_history_naming_the_option(tmp_path):
    from notebook_kit.cli.script_launch import LaunchInputError, plan_script_launch

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(LaunchInputError, match=r"^--memory-history: a script records its GPU"):
        plan_script_launch(str(script), given={"memory_history": True})
