"""A run in which no rank makes progress says where each rank waits, and goes on.

The hang users of every tool report: one rank in ``should_stop()``'s vote (or any collective)
that another never joins. Real workers, real gloo collectives; ``stall_seconds`` is short here.
"""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from notebook_kit import WorkerError, notebook_launcher, should_stop
from notebook_kit.launch.stall_watch import describe_stall
from notebook_kit.runtime.waiting import STOP_VOTE, collective_of, frames_in_traceback

pytestmark = [pytest.mark.usefixtures("no_leftover_processes")]

REPORT = "No rank has made progress for"


def _vote_here_barrier_there() -> None:
    if dist.get_rank() == 0:
        while not should_stop():
            pass
    else:
        dist.barrier()  # the line the report must show for rank 1


@pytest.mark.integration
def test_a_stalled_run_shows_where_each_rank_waits_and_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):  # the report stopped nothing: the timeout did
        notebook_launcher(
            _vote_here_barrier_there, num_processes=2, stall_seconds=1.0, timeout=3.5, live=False
        )
    assert time.monotonic() - started >= 3.5
    out = capsys.readouterr().out
    assert out.count(REPORT) == 1, out  # once per stall
    assert f"rank 0: waiting in {STOP_VOTE}" in out, out
    assert "rank 1: waiting in dist.barrier" in out, out
    assert "while not should_stop():" in out and "dist.barrier()  # the line" in out, out
    assert "different collectives" in out and "threading.py" not in out


def _print_for(seconds: float) -> int:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        print("step", flush=True)
        time.sleep(0.3)
    return dist.get_rank()


@pytest.mark.integration
def test_a_run_that_keeps_printing_is_never_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert notebook_launcher(_print_for, args=(2.5,), num_processes=2, stall_seconds=1.0) == 0
    assert REPORT not in capsys.readouterr().out


def _leave_while_rank_zero_votes() -> None:
    if dist.get_rank() == 0:
        while not should_stop():
            pass


@pytest.mark.integration
def test_a_rank_that_returns_during_the_stop_vote_is_blamed_and_the_vote_named() -> None:
    with pytest.raises(WorkerError) as raised:
        notebook_launcher(_leave_while_rank_zero_votes, num_processes=2, live=False)
    message = str(raised.value)
    assert raised.value.rank == 1, message
    assert f"returned while rank 0 still needed it (in {STOP_VOTE})" in message, message
    assert "call it on every rank at the same steps" in message


def test_the_collective_is_named_from_a_stack_or_a_traceback() -> None:
    c10d = "/venv/site-packages/torch/distributed/distributed_c10d.py"
    assert collective_of([("train.py", "train"), (c10d, "all_gather")]) == "dist.all_gather"
    assert collective_of([("train.py", "train"), ("/x/threading.py", "wait")]) is None
    import notebook_kit.runtime.stopping as stopping

    voting = [("train.py", "train"), (stopping.__file__, "_vote"), (c10d, "all_reduce")]
    assert collective_of(voting) == STOP_VOTE
    text = f'Traceback:\n  File "train.py", line 3, in train\n  File "{c10d}", line 9, in barrier\n'
    assert collective_of(frames_in_traceback(text)) == "dist.barrier"


def test_the_report_names_ranks_that_never_joined_and_ranks_that_did_not_answer() -> None:
    answers = {
        0: [{"collective": "dist.all_reduce", "stack": '  File "t.py", line 1, in f\n'}],
        1: [{"collective": None, "stack": '  File "t.py", line 5, in f\n    time.sleep(9)\n'}],
    }
    text = describe_stall(61.2, {0, 1, 2}, answers)
    assert text.startswith(f"{REPORT} 61 s")
    assert "rank 0: waiting in dist.all_reduce" in text and "rank 1: not in a collective" in text
    assert "time.sleep(9)" in text and "rank 2: no answer" in text
    assert "Rank 1 never joined: the others wait for it." in text
