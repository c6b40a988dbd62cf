"""Post-mortem of a failed rank, typed at in a real kernel's cell as a frontend does it.

Each cell runs with ``allow_stdin=True`` and every ``input_request`` on the stdin channel is
answered with an ``input_reply`` (``tests/test_debugger_kernel_integration.py`` has the loop).
"""

from __future__ import annotations

import time

import pytest

from tests.kernel_cells import real_kernel
from tests.test_debugger_kernel_integration import Cell, _no_children, _run

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]

POOL = """\
from notebook_kit import WorkerPool
pool = WorkerPool(num_processes=2{options})
"""
FAILING_CELL = (
    "import torch.distributed as dist\n"
    "x = 5 + 10 * dist.get_rank()\n"
    "if dist.get_rank() >= {first}:\n"
    "    1/0\n"
)


def _typed(*lines: str):
    """Answer the prompts with ``lines`` in order."""

    def answer(prompt: str, cell: Cell) -> str:
        return lines[len(cell.prompts) - 1]

    return answer


def test_pool_debug_opens_rank_1s_failing_frame_and_q_leaves_the_same_workers_usable():
    with real_kernel() as (manager, client):
        assert _run(client, POOL.format(options="")).error is None
        failed = _run(client, f"pool.run_cell({FAILING_CELL.format(first=1)!r})")
        assert failed.error is not None and "ZeroDivisionError" in failed.error["evalue"]
        pids = _run(client, "pids = pool.pids")
        assert pids.error is None
        debugged = _run(client, "pool.debug()", _typed("p x", "q"))
        assert debugged.error is None, debugged
        assert debugged.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "]
        assert "Post-mortem of rank 1: ZeroDivisionError" in debugged.text, debugged.text
        assert "\n15\n" in debugged.text, debugged.text  # rank 1's x, in its failing frame
        again = _run(client, "print('again', pool.run_cell('x'), pool.pids == pids)")
        assert again.error is None and "again 5 True" in again.text, again
        _run(client, "pool.close()")
        _no_children(manager)


def test_rank_chooses_among_the_failed_ranks_and_the_others_are_refused_before_sending():
    with real_kernel() as (manager, client):
        assert _run(client, POOL.format(options="")).error is None
        failed = _run(client, f"pool.run_cell({FAILING_CELL.format(first=0)!r})")
        assert failed.error is not None
        chosen = _run(client, "pool.debug(rank=0)", _typed("p x", "c"))
        assert chosen.error is None and chosen.prompts == ["(Pdb rank 0) "] * 2, chosen
        assert "\n5\n" in chosen.text, chosen.text
        also = _run(client, "pool.debug(rank=1)", _typed("p x", "q"))
        assert also.error is None and "\n15\n" in also.text, also
        out_of_range = _run(client, "pool.debug(rank=7)", _typed("q"))
        assert out_of_range.prompts == [] and out_of_range.error is not None
        assert "rank=7" in out_of_range.error["evalue"], out_of_range.error
        _run(client, "pool.restart()")
        restarted = _run(client, "pool.debug()", _typed("q"))
        assert restarted.prompts == [] and restarted.error is not None
        assert "stopped or restarted since" in restarted.error["evalue"], restarted.error
        _run(client, "pool.close()")
        _no_children(manager)


def test_a_distributed_cell_with_pdb_opens_the_failing_rank_at_once_then_shows_its_error():
    cell = "%%distributed -n 2 --pdb\n" + FAILING_CELL.format(first=1)
    with real_kernel() as (manager, client):
        assert _run(client, "%load_ext notebook_kit").error is None
        shown = _run(client, cell, _typed("p x", "q"))
        assert shown.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "], shown
        assert "\n15\n" in shown.text, shown.text
        assert shown.error is not None and "ZeroDivisionError" in shown.error["evalue"]
        after = _run(client, "%%distributed\nx")
        assert after.error is None, after  # the pool kept its workers
        refused = _run(client, "%%distributed --pdb --noblock\nx")
        assert "UsageError: --pdb asks" in refused.text, refused  # IPython prints it
        _run(client, "%distributed close")
        _no_children(manager)


LAUNCH = """\
from notebook_kit import notebook_launcher

def train():
    import torch, torch.distributed as dist
    rank = dist.get_rank()
    secret = 40 + rank
    if rank == 1:
        raise ValueError("rank 1 gave up")
    dist.barrier()  # rank 0 waits here while rank 1 is in its post-mortem
    return rank

notebook_launcher(train, num_processes=2, post_mortem=True)
"""


def test_a_launch_with_post_mortem_keeps_rank_1_in_its_frame_then_fails_as_usual():
    with real_kernel() as (manager, client):
        cell = _run(client, LAUNCH, _typed("p secret", "q"))
        assert cell.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "], cell
        assert "\n41\n" in cell.text, cell.text
        assert cell.error is not None and cell.error["ename"] == "WorkerError", cell.error
        assert "ank 1" in cell.error["evalue"] and "gave up" in cell.error["evalue"]
        _no_children(manager)
        nxt = _run(client, 'print("next", notebook_launcher(lambda: 7, num_processes=2))')
        assert nxt.error is None and "next 7" in nxt.text, nxt
        headless = _run(client, LAUNCH, _typed("q"), allow_stdin=False)
        assert headless.prompts == [] and headless.error is not None, headless
        assert "post-mortem on rank 1 at " in headless.text, headless.text
        assert "skipped: this frontend allows no input" in headless.text, headless.text
        _no_children(manager)


def test_a_pool_with_post_mortem_opens_each_failed_command_at_once():
    with real_kernel() as (manager, client):
        assert _run(client, POOL.format(options=", post_mortem=True")).error is None
        code = f"pool.run_cell({FAILING_CELL.format(first=1)!r})"
        failed = _run(client, code, _typed("p x", "c"))
        assert failed.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "], failed
        assert "\n15\n" in failed.text, failed.text
        assert failed.error is not None and "ZeroDivisionError" in failed.error["evalue"]
        again = _run(client, "print('again', pool.run_cell('x'), pool.restarts)")
        assert again.error is None and "again 5 0" in again.text, again
        _run(client, "pool.close()")
        _no_children(manager)


def test_the_time_at_a_pool_ranks_prompt_counts_against_no_timeout():
    def slowly(prompt: str, cell: Cell) -> str:
        time.sleep(3.0)  # past the pool's timeout=2
        return "c"

    code = (
        "import time, torch.distributed as dist\n"
        "if dist.get_rank() == 1:\n"
        "    breakpoint()\n"
        "time.sleep(0.3)\n"
        "7"
    )
    with real_kernel() as (manager, client):
        assert _run(client, POOL.format(options=", timeout=2")).error is None
        ran = _run(client, f"print('value', pool.run_cell({code!r}))", slowly)
        assert ran.prompts == ["(Pdb rank 1) "], ran
        assert ran.error is None and "value 7" in ran.text, ran
        _run(client, "pool.close()")
        _no_children(manager)
