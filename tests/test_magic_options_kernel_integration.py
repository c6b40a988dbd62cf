"""``%%distributed``'s options in a real Jupyter kernel: ranks, --noblock, --local, --out, layouts.

One kernel runs the cells in order on a pool of three forked ranks, as a notebook would; each
test reads what its cells showed. ``--noblock`` is read from every iopub message, whatever cell
it belongs to: its lines must keep the cell that started it as their parent while the next
cell runs (ipykernel sends a message under the cell its parent header names, and JupyterLab
draws it there).
"""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.kernel_cells import real_kernel

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

Message = dict[str, Any]

START = """\
%%distributed -n 3
import time, torch.distributed as dist
rank = dist.get_rank()
mark, runs = 'old', 0"""
SUBSET = "%%distributed --ranks 1,2\nruns += 1\nmark = f'new{rank}'\nprint('ran on', rank)\nrank"
SLICED = "%%distributed --ranks 0:4:2 --out seen\nruns += 1\n(rank, runs)"
STATE = "%%distributed --out state\n(mark, runs)"
NOBLOCK = """\
%%distributed --noblock
for tick in range(5):
    print(f'tick {tick} on {rank}', flush=True)
    time.sleep(0.3)
rank + 100"""
WHILE = "handle = _\nwhile not handle.done():\n    time.sleep(0.05)\nhandle.done()"
ORDER_FIRST = "%%distributed --noblock\ntime.sleep(1)\norder = ['noblock']"
ORDER_NEXT = "%%distributed\norder.append('next')\norder"
LOCAL = """\
%%distributed --local
import pathlib, torch.distributed as dist
if dist.is_initialized():
    with open(MARK, 'a') as marks:
        marks.write(f'rank {dist.get_rank()}\\n')
else:
    local_saw = pathlib.Path(MARK).read_text()
'on the ranks' if dist.is_initialized() else 'in the kernel'"""
LOCAL_FAILS = (
    "%%distributed --local\nimport torch.distributed as dist\n"
    "if not dist.is_initialized():\n    raise KeyError('kernel only')"
)
SPIN = """\
%%distributed --noblock
stopped_by, spins = None, 0
try:
    while True:
        spins += 1
        time.sleep(0.01)
except KeyboardInterrupt:
    stopped_by = 'interrupt'
    raise"""
PRINTS = (
    "import time\nfor line in range(3):\n    print(f'line {line}', flush=True)\n    time.sleep(0.4)"
)


class Kernel:
    """A kernel and every iopub message it sent, in order, with the request each answered."""

    def __init__(self, manager: Any, client: Any) -> None:
        self.manager = manager
        self.client = client
        self.seen: list[Message] = []
        self.replies: dict[str, dict[str, Any]] = {}  # request id -> its execute_reply

    def run(self, code: str, timeout: float = 90.0) -> tuple[str, list[Message]]:
        """Run ``code``; its request id and its own messages, once the kernel is idle again."""
        msg_id = self.client.execute(code)
        while True:
            message = self.client.get_iopub_msg(timeout=timeout)
            self.seen.append(message)
            mine = message["parent_header"].get("msg_id") == msg_id
            state = message["content"].get("execution_state")
            if mine and message["msg_type"] == "status" and state == "idle":
                while msg_id not in self.replies:
                    reply = self.client.get_shell_msg(timeout=timeout)
                    self.replies[_parent(reply) or ""] = reply["content"]
                return msg_id, [m for m in self.seen if _parent(m) == msg_id]


def _parent(message: Message) -> str | None:
    return message["parent_header"].get("msg_id")


def _text(messages: list[Message]) -> str:
    return "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")


def _value(messages: list[Message]) -> str:
    results = [m for m in messages if m["msg_type"] == "execute_result"]
    return results[0]["content"]["data"]["text/plain"] if results else ""


def _error(messages: list[Message]) -> dict[str, Any]:
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert len(errors) == 1, [m["content"] for m in messages]
    return errors[0]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    with real_kernel() as (manager, client):
        runner = Kernel(manager, client)
        marks = tmp_path_factory.mktemp("local") / "marks"
        runner.run(f"%load_ext notebook_kit\nimport time\nMARK = {str(marks)!r}")
        _, started = runner.run(START)
        assert not [m for m in started if m["msg_type"] == "error"], _text(started)
        yield runner


def test_a_subset_runs_alone_and_the_other_ranks_keep_their_state(kernel: Kernel) -> None:
    _, subset = kernel.run(SUBSET)
    assert _value(subset) == "1"  # the lowest rank it ran on
    assert "ran on 1" in _text(subset) and "ran on 2" in _text(subset)
    assert "ran on 0" not in _text(subset)
    _, sliced = kernel.run(SLICED)
    assert _value(sliced) == "(0, 1)"
    _, shown = kernel.run("seen")
    assert ast.literal_eval(_value(shown)) == {0: (0, 1), 2: (2, 2)}  # 0:4:2 of 3 ranks
    kernel.run(STATE)
    _, shown = kernel.run("state")
    # rank 0 ran only the sliced cell, rank 1 only the listed one, rank 2 both
    assert ast.literal_eval(_value(shown)) == {0: ("old", 1), 1: ("new1", 1), 2: ("new2", 2)}


def test_noblock_returns_a_handle_and_its_lines_stay_under_its_cell(kernel: Kernel) -> None:
    started, messages = kernel.run(NOBLOCK)
    assert re.fullmatch(
        r"<DistributedResult of In \[\d+\] on every rank: running>", _value(messages)
    )
    waiting, _ = kernel.run(WHILE)  # a kernel cell that runs while the ranks print
    order = [m for m in kernel.seen if _parent(m) in (started, waiting)]
    busy = next(i for i, m in enumerate(order) if _parent(m) == waiting)
    ticks = [m for m in order[busy:] if "tick" in m["content"].get("text", "")]
    assert ticks, "no line of the --noblock cell arrived while the next cell ran"
    assert all(_parent(m) == started for m in ticks)  # under the cell that started them
    every = "".join(m["content"].get("text", "") for m in kernel.seen if _parent(m) == started)
    assert all(f"tick {t} on {r}" in every for t in range(5) for r in range(3))
    _, result = kernel.run("handle.result(), handle.results()")
    assert _value(result) == "(100, {0: 100, 1: 101, 2: 102})"
    _, shown = kernel.run("handle")
    assert _value(shown).endswith("on every rank: done>")


def test_the_next_command_waits_for_a_noblock_cell(kernel: Kernel) -> None:
    kernel.run(ORDER_FIRST)
    _, after = kernel.run(ORDER_NEXT)
    assert _value(after) == "['noblock', 'next']"
    assert re.search(r"Waiting for the --noblock cell In \[\d+\] to end", _text(after))


def test_distributed_wait_raises_the_noblock_error_and_out_lands_later(kernel: Kernel) -> None:
    kernel.run("%%distributed --noblock\nif rank == 2:\n    raise ValueError('late failure')")
    error = _error(kernel.run("%distributed wait")[1])
    assert error["ename"] == "PoolRunError" and "late failure" in error["evalue"]
    assert error["evalue"].startswith("Rank 2 of 3 failed")
    # A cell that takes a moment: its handle is shown before it ends, on a busy machine too.
    slow = "%%distributed --noblock --out later --ranks 1:\ntime.sleep(1)\nrank * 3"
    _, started = kernel.run(slow)
    assert "running" in _value(started)
    _, waited = kernel.run("%distributed wait")
    assert _value(waited) == "3"
    _, shown = kernel.run("later")
    assert ast.literal_eval(_value(shown)) == {1: 3, 2: 6}


def test_a_noblock_cell_is_interrupted_by_its_handle_or_ctrl_c_in_wait(kernel: Kernel) -> None:
    _, pids = kernel.run("pool = %distributed\npool.pids")
    kernel.run(SPIN)
    _, stopped = kernel.run("h = _\ntime.sleep(1)\nh.interrupt()\nh.wait(30), h.result(timeout=0)")
    assert _error(stopped)["ename"] == "KeyboardInterrupt"
    _, after = kernel.run("%%distributed\n(stopped_by, spins > 0)")
    assert _value(after) == "('interrupt', True)"
    _, same = kernel.run("pool.pids")
    assert _value(same) == _value(pids)  # the workers kept running, with their names
    kernel.run(SPIN)
    msg_id = kernel.client.execute("%distributed wait")
    time.sleep(1.5)
    kernel.manager.interrupt_kernel()  # as Jupyter's interrupt button does
    kernel.run("1")  # the wait's messages come first
    wait_messages = [m for m in kernel.seen if _parent(m) == msg_id]
    assert _error(wait_messages)["ename"] == "KeyboardInterrupt"
    _, after = kernel.run("%%distributed\n(stopped_by, spins > 0)")
    assert _value(after) == "('interrupt', True)"


def test_local_runs_the_cell_in_the_kernel_after_the_ranks(kernel: Kernel) -> None:
    _, local = kernel.run(LOCAL)
    assert _value(local) == "'on the ranks'"  # the cell's value is the ranks'
    _, shown = kernel.run("sorted(local_saw.splitlines())")
    assert ast.literal_eval(_value(shown)) == ["rank 0", "rank 1", "rank 2"]
    _, failed = kernel.run(LOCAL_FAILS)
    errors = [m["content"]["ename"] for m in failed if m["msg_type"] == "error"]
    assert errors == ["KeyError", "LocalRunFailed"], errors


def test_interleave_prefixes_lines_in_arrival_order(kernel: Kernel) -> None:
    _, mixed = kernel.run(f"%%distributed --interleave\n{PRINTS}")
    lines = _text(mixed).splitlines()
    assert sorted(lines) == sorted(f"[rank {r}] line {i}" for r in range(3) for i in range(3))
    assert [int(line[-1]) for line in lines] == sorted(int(line[-1]) for line in lines)
    _, grouped = kernel.run("%%distributed --group-outputs\nprint('a')\nprint('b')")
    assert _text(grouped) == "[rank 0]\na\nb\n[rank 1]\na\nb\n[rank 2]\na\nb\n"


POOL_PIDS = "pool = %distributed\npool.pids"
BAD = [
    ("%%distributed --bogus\nmark = 'changed'", "unrecognized arguments: --bogus"),
    ("%%distributed --ranks 5\nmark = 'changed'", "--ranks 5: the pool has 3 ranks"),
    ("%%distributed --ranks 7:9\nmark = 'changed'", "--ranks 7:9 selects none"),
    ("%%distributed -n 2 --ranks 2\nmark = 'changed'", "the pool has 2 ranks (0 to 1)"),
    ("%%distributed --ranks\nmark = 'changed'", "argument --ranks: expected one argument"),
    ("%%distributed --ranks 1-2\nmark = 'changed'", "argument --ranks: '1-2' is not a set"),
    ("%%distributed --ranks ''\nmark = 'changed'", "argument --ranks: no ranks given"),
    ("%%distributed --out 2x\nmark = 'changed'", "argument --out: '2x' is not a Python name"),
    ("%%distributed --group-outputs --interleave\nmark = 'changed'", "--group-outputs and"),
    ("%%distributed --noblock --local\nmark = 'changed'", "--local runs the cell"),
    ("%distributed --ranks 1", "--ranks is an option of a %%distributed cell"),
]


@pytest.mark.parametrize(("code", "words"), BAD, ids=[code.split("\n")[0] for code, _ in BAD])
def test_a_bad_option_is_a_usage_error_before_anything_runs(
    kernel: Kernel, code: str, words: str
) -> None:
    pids = _value(kernel.run(POOL_PIDS)[1])
    msg_id, messages = kernel.run(code)
    reply = kernel.replies[msg_id]  # IPython prints a usage error alone, without a traceback
    assert reply["status"] == "error" and reply["ename"] == "UsageError", reply
    shown = _text(messages)
    assert shown.startswith("UsageError: ") and words in shown, shown
    assert _value(kernel.run(POOL_PIDS)[1]) == pids  # the same pool: none started or closed
    _, marks = kernel.run("%%distributed --out marks\nmark")
    assert not [m for m in marks if m["msg_type"] == "error"], _text(marks)
    _, shown = kernel.run("set(marks.values()) & {'changed'}")
    assert _value(shown) == "set()"
