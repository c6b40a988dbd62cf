"""``breakpoint()`` on a rank, typed at in a real kernel's cell as a frontend does it.

Each cell runs with ``allow_stdin=True`` and every ``input_request`` on the stdin channel is
answered with an ``input_reply``, the way JupyterLab answers the box it shows; an interrupt is
Jupyter's (``interrupt_kernel``: SIGINT to the kernel's process group).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.kernel_cells import launched_below, real_kernel

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]

LAUNCH = """\
import os
from notebook_kit import notebook_launcher

def train():
    import torch, torch.distributed as dist
    rank = dist.get_rank()
    x = torch.tensor([10.0 + rank])
    secret = 40 + rank
    {stop}
    dist.all_reduce(x)  # the other rank waits here while one is in pdb
    return float(x)

print("result", notebook_launcher(train, num_processes=2{options}))
"""
RANK_1 = "if rank == 1:\n        breakpoint()"
EVERY_RANK = "breakpoint()"
NEXT_LAUNCH = 'print("next", notebook_launcher(lambda: 7, num_processes=2))'
# How long a rank's collective waits for the others: torch's default (30 min for gloo) would
# end a pdb session under the ranks that wait for the one at the prompt.
COLLECTIVE_WAIT = """\
from notebook_kit import notebook_launcher
def waits():
    import torch, torch.distributed as dist
    group = dist.distributed_c10d._get_default_group()
    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
print("waits", notebook_launcher(waits, num_processes=2))
"""


@dataclass
class Cell:
    """What a cell showed: its stream text, the prompts it asked, and its error, if any."""

    text: str = ""
    prompts: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None


def _run(
    client: Any,
    code: str,
    answer: Callable[[str, Cell], str | None] = lambda prompt, cell: "c",
    allow_stdin: bool = True,
    timeout: float = 90.0,
) -> Cell:
    """Run ``code``; ``answer(prompt, cell)`` gives each line typed (None: leave it unanswered)."""
    msg_id = client.execute(code, allow_stdin=allow_stdin)
    cell, parts = Cell(), []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        while client.stdin_channel.msg_ready():
            request = client.get_stdin_msg(timeout=1)
            if request["msg_type"] == "input_request":
                cell.text = "".join(parts)
                cell.prompts.append(request["content"]["prompt"])
                line = answer(request["content"]["prompt"], cell)
                if line is not None:
                    client.input(line)
        while client.iopub_channel.msg_ready():
            message = client.get_iopub_msg(timeout=1)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                parts.append(content["text"])
            elif kind == "error":
                cell.error = content
            elif kind == "status" and content["execution_state"] == "idle":
                cell.text = "".join(parts)
                return cell
        time.sleep(0.01)
    raise AssertionError(f"cell did not finish; output so far: {''.join(parts)!r}")


def _no_children(manager: Any) -> None:
    """Nothing the launch started is left below the kernel."""
    kernel = manager.provisioner.process.pid
    deadline = time.monotonic() + 5.0
    while launched_below(kernel) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert launched_below(kernel) == []


def test_p_prints_rank_1s_variable_while_rank_0_waits_in_all_reduce_and_c_ends_normally():
    lines = iter(["p secret", "p x", "c"])

    def slowly(prompt: str, cell: Cell) -> str:
        time.sleep(3.0)  # 9 s at the prompt in all: past stall_seconds and the timeout
        return next(lines)

    options = ", stall_seconds=1, timeout=8"
    with real_kernel() as (manager, client):
        cell = _run(client, LAUNCH.format(stop=RANK_1, options=options), slowly)
        _no_children(manager)
    assert cell.error is None, cell.error  # time at the prompt is not the launch's timeout
    assert cell.prompts == ["(Pdb rank 1) "] * 3
    assert "\n41\n" in cell.text, cell.text  # rank 1's own variable
    assert "tensor([11.])" in cell.text, cell.text
    assert "result 21.0" in cell.text  # the all_reduce met once rank 1 went on
    assert "No rank has made progress" not in cell.text  # time at the prompt is no stall


def test_a_collective_waits_a_week_where_the_cell_can_answer_pdb_and_torchs_default_elsewhere():
    with real_kernel() as (_, client):
        typed = _run(client, COLLECTIVE_WAIT)
        headless = _run(client, COLLECTIVE_WAIT, allow_stdin=False)
    assert "waits 604800.0" in typed.text, typed.text
    assert "waits 1800.0" in headless.text, headless.text


def test_q_ends_the_run_as_rank_1s_failure_and_the_next_launch_works():
    with real_kernel() as (manager, client):
        cell = _run(client, LAUNCH.format(stop=RANK_1, options=""), lambda p, c: "q")
        assert cell.error is not None and cell.error["ename"] == "WorkerError", cell
        assert "rank 1" in cell.error["evalue"], cell.error["evalue"]
        assert "quit the debugger" in cell.error["evalue"], cell.error["evalue"]
        _no_children(manager)
        after = _run(client, NEXT_LAUNCH)
        assert after.error is None and "next 7" in after.text, after
        _no_children(manager)


def test_two_ranks_at_a_breakpoint_take_the_prompt_one_after_the_other():
    def answer(prompt: str, cell: Cell) -> str:
        return "c" if len(cell.prompts) % 2 == 0 else "p secret"

    with real_kernel() as (_, client):
        cell = _run(client, LAUNCH.format(stop=EVERY_RANK, options=""), answer)
    assert cell.error is None, cell.error
    first, second = cell.prompts[0], cell.prompts[2]
    assert {first, second} == {"(Pdb rank 0) ", "(Pdb rank 1) "}, cell.prompts
    assert cell.prompts == [first, first, second, second]  # one rank at a time, to its end
    waiting = second.removeprefix("(Pdb ").removesuffix(") ")
    assert f"{waiting} is also at a breakpoint, next" in cell.text, cell.text
    assert "\n40\n" in cell.text and "\n41\n" in cell.text, cell.text
    assert "result 21.0" in cell.text


def test_notebook_kit_break_ranks_stops_one_rank_and_the_other_says_it_skipped():
    code = LAUNCH.format(stop=EVERY_RANK, options="").replace(
        "import os\n", 'import os\nos.environ["NOTEBOOK_KIT_BREAK_RANKS"] = "1"\n'
    )
    with real_kernel() as (_, client):
        cell = _run(client, code, lambda p, c: "p secret" if len(c.prompts) == 1 else "c")
    assert cell.error is None, cell.error
    assert cell.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "]
    assert cell.text.count("skipped") == 1, cell.text
    assert "breakpoint() on rank 0 at" in cell.text, cell.text
    assert "result 21.0" in cell.text


def test_without_stdin_each_rank_says_which_breakpoint_it_skipped_and_the_run_goes_on():
    with real_kernel() as (_, client):
        cell = _run(client, LAUNCH.format(stop=EVERY_RANK, options=""), allow_stdin=False)
    assert cell.error is None, cell.error
    assert cell.prompts == []
    for rank in (0, 1):
        assert f"breakpoint() on rank {rank} at " in cell.text, cell.text
    assert cell.text.count("skipped: this frontend allows no input") == 2, cell.text
    plain = re.sub(r"\x1b\[[0-9;]*m", "", cell.text)  # IPython colours pdb's listing
    assert "train()" not in plain  # pdb's listing is not shown for a skipped stop
    assert "(Pdb" not in cell.text and "result 21.0" in cell.text


def test_an_interrupt_at_the_pdb_prompt_ends_the_run_and_leaves_nothing():
    with real_kernel() as (manager, client):

        def interrupt(prompt: str, cell: Cell) -> None:
            manager.interrupt_kernel()  # SIGINT to the kernel's process group, as Jupyter does

        cell = _run(client, LAUNCH.format(stop=RANK_1, options=""), interrupt)
        assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt", cell
        _no_children(manager)
        after = _run(client, NEXT_LAUNCH)
        assert after.error is None and "next 7" in after.text, after


POOL = """\
from notebook_kit import WorkerPool
pool = WorkerPool(num_processes=2)

def step():
    import torch, torch.distributed as dist
    x = torch.tensor([float(dist.get_rank())])
    if dist.get_rank() == 1:
        breakpoint()
    dist.all_reduce(x)
    return float(x)

def alone():
    import torch.distributed as dist
    if dist.get_rank() == 1:
        breakpoint()
    return dist.get_rank()
"""


def test_a_pool_command_opens_pdb_on_rank_1_and_q_leaves_the_pool_usable():
    with real_kernel() as (manager, client):
        assert _run(client, POOL).error is None
        cell = _run(
            client,
            "print('got', pool.run(step))",
            lambda p, c: "p x" if len(c.prompts) == 1 else "c",
        )
        assert cell.error is None, cell
        assert cell.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "]
        assert "tensor([1.])" in cell.text and "got 1.0" in cell.text, cell.text
        quit_cell = _run(client, "pool.run(step)", lambda p, c: "q")
        assert quit_cell.error is not None, quit_cell
        assert "rank 1" in quit_cell.error["evalue"], quit_cell.error
        assert "quit the debugger" in quit_cell.error["evalue"], quit_cell.error
        again = _run(client, "print('again', pool.run(lambda: 5))")
        assert again.error is None and "again 5" in again.text, again
        _run(client, "pool.close()")
        _no_children(manager)


def test_a_distributed_cell_opens_pdb_on_rank_1_in_the_cell():
    cell = (
        "%%distributed -n 2\n"
        "import torch.distributed as dist\n"
        "rank = dist.get_rank()\n"
        "if rank == 1:\n"
        "    seen = 'on one'\n"
        "    breakpoint()\n"
        "dist.barrier()\n"
        "rank + 10"
    )
    with real_kernel() as (manager, client):
        assert _run(client, "%load_ext notebook_kit").error is None
        shown = _run(client, cell, lambda p, c: "p seen" if len(c.prompts) == 1 else "c")
        assert shown.error is None, shown
        assert shown.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "]
        assert "'on one'" in shown.text, shown.text
        _run(client, "%distributed close")
        _no_children(manager)


def test_a_rank_at_the_prompt_after_the_others_finished_is_waited_for_past_the_rendezvous_timeout():
    code = """\
from notebook_kit import notebook_launcher
import torch.distributed as dist

def train():
    if dist.get_rank() == 1:
        breakpoint()
    return dist.get_rank()

print("result", notebook_launcher(train, num_processes=2, rendezvous_timeout=2))
"""

    def slowly(prompt: str, cell: Cell) -> str:
        time.sleep(5.0)  # rank 0, which hosts the store, has long finished
        return "c"

    with real_kernel() as (manager, client):
        cell = _run(client, code, slowly)
        _no_children(manager)
    assert cell.error is None, cell.error
    assert "result 0" in cell.text, cell.text


def test_an_interrupt_at_a_pool_ranks_prompt_interrupts_that_rank_and_the_pool_keeps_its_workers():
    with real_kernel() as (manager, client):
        assert _run(client, POOL).error is None

        def interrupt(prompt: str, cell: Cell) -> None:
            manager.interrupt_kernel()  # SIGINT to the kernel's process group, as Jupyter does

        cell = _run(client, "pool.run(alone)", interrupt)  # rank 0 waits in no collective
        assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt", cell
        again = _run(client, "print('again', pool.run(lambda: 5), pool.restarts)")
        assert again.error is None and "again 5 0" in again.text, again  # the same workers
        _run(client, "pool.close()")
        _no_children(manager)


def test_an_awaited_launch_opens_pdb_in_its_cell_too():
    code = LAUNCH.format(stop=RANK_1, options="").replace(
        'print("result", notebook_launcher(train, num_processes=2))',
        "from notebook_kit import notebook_launcher_async\n"
        'print("result", await notebook_launcher_async(train, num_processes=2))',
    )
    with real_kernel() as (manager, client):
        cell = _run(client, code, lambda p, c: "p secret" if len(c.prompts) == 1 else "c")
        _no_children(manager)
    assert cell.error is None, cell.error
    assert cell.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "]
    assert "\n41\n" in cell.text and "result 21.0" in cell.text, cell.text
