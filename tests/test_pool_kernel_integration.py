"""The %%distributed magic in real Jupyter kernels: names, output, errors, restarts, interrupts."""

from __future__ import annotations

import ast
import time
from typing import Any

import nbformat
import psutil
import pytest
from nbclient import NotebookClient

from tests.kernel_cells import cell_messages, real_kernel, run_cell
from tests.notebook_text import cell_text
from tests.processes import kernel_environment

pytestmark = pytest.mark.integration

FIRST = """\
%%distributed -n 2
import os, threading, torch.distributed as dist
rank = dist.get_rank()
print(f"hello from {rank}")
print(f"second line {rank}")
rank + 40"""
COUNTS = "(len(os.listdir('/proc/self/fd')), threading.active_count())"
CELLS = [
    "%load_ext notebook_kit",
    FIRST,
    "%%distributed\nrank * 2",
    "%%distributed\nif rank == 1:\n    raise ValueError('only on one')",
    "offset = 100\ndef helper(value):\n    return value + offset",  # a kernel cell, after start
    "%%distributed\nhelper(rank)",
    f"%%distributed\nworker_counts = {COUNTS}",
    f"import os, threading\nkernel_counts = {COUNTS}",
    *[f"%%distributed\nvalue = {index}" for index in range(20)],
    f"%%distributed\n{COUNTS} == worker_counts",
    f"{COUNTS} == kernel_counts",
    "%%distributed\nif rank == 1:\n    os._exit(1)\ndist.barrier()",
    "%%distributed\nimport torch.distributed as dist\n(dist.get_world_size(), 'rank' in globals())",
    "pool = %distributed\npool.pids",
]


def _result(cell: Any) -> str:
    results = [o for o in cell.outputs if o["output_type"] == "execute_result"]
    return results[0]["data"]["text/plain"] if results else ""


def _error(cell: Any) -> dict[str, Any]:
    errors = [o for o in cell.outputs if o["output_type"] == "error"]
    assert len(errors) == 1, cell.outputs
    return errors[0]


@pytest.fixture(scope="module")
def executed() -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    client = NotebookClient(notebook, timeout=120, kernel_name="python3", allow_errors=True)
    client.execute(env=kernel_environment())  # ends by shutting the kernel down
    return notebook


def _cell(notebook: nbformat.NotebookNode, source: str) -> Any:
    return next(cell for cell in notebook.cells if cell.source == source)


def test_names_persist_and_output_is_grouped_by_rank(executed: nbformat.NotebookNode) -> None:
    first = _cell(executed, FIRST)
    text = cell_text(first)
    assert "Started a pool for %%distributed cells: 2 processes on CPU (gloo)" in text
    grouped = "[rank 0]\nhello from 0\nsecond line 0\n[rank 1]\nhello from 1\nsecond line 1\n"
    assert grouped in text
    assert _result(first) == "40"
    assert _result(_cell(executed, "%%distributed\nrank * 2")) == "0"
    assert _result(_cell(executed, "%%distributed\nhelper(rank)")) == "100"


def test_an_error_names_its_rank_and_the_workers_stay(executed: nbformat.NotebookNode) -> None:
    error = _error(_cell(executed, CELLS[3]))
    assert error["ename"] == "PoolRunError"
    assert error["evalue"].startswith("Rank 1 of 2 failed: ValueError: only on one")
    assert "still running" in error["evalue"] and "raise ValueError" in error["evalue"]


def test_twenty_cells_leave_no_descriptor_or_thread_behind(
    executed: nbformat.NotebookNode,
) -> None:
    assert _result(_cell(executed, f"%%distributed\n{COUNTS} == worker_counts")) == "True"
    assert _result(_cell(executed, f"{COUNTS} == kernel_counts")) == "True"


def test_a_dead_rank_restarts_the_workers_and_says_names_are_lost(
    executed: nbformat.NotebookNode,
) -> None:
    error = _error(_cell(executed, CELLS[-3]))
    assert error["evalue"].startswith("Rank 1 of 2 failed: exited with code 1")
    assert "Everything defined on the workers is lost" in error["evalue"]
    after = _cell(executed, CELLS[-2])
    assert "Starting 2 new workers for the pool" in cell_text(after)
    assert _result(after) == "(2, False)"  # a working group, without the old names


def test_kernel_shutdown_leaves_no_worker(executed: nbformat.NotebookNode) -> None:
    pids = ast.literal_eval(_result(executed.cells[-1]))
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(psutil.pid_exists(pid) for pid in pids)


def _interrupt_while_running(manager: Any, client: Any, code: str) -> tuple[list, float, float]:
    """Start ``code``, interrupt the kernel once the workers are busy.

    Returns the cell's messages, the wall-clock time of the interrupt, and the seconds until
    the kernel was idle again (which include IPython formatting the traceback).
    """
    msg_id = client.execute(code)
    time.sleep(1.5)
    interrupted, started = time.time(), time.monotonic()
    manager.interrupt_kernel()
    messages = cell_messages(client, msg_id, timeout=30)
    return messages, interrupted, time.monotonic() - started


def _text(messages: list[dict[str, Any]], kind: str = "stream") -> str:
    return "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == kind)


def _value(messages: list[dict[str, Any]]) -> str:
    results = [m for m in messages if m["msg_type"] == "execute_result"]
    return results[0]["content"]["data"]["text/plain"] if results else ""


LOOP = """\
%%distributed
try:
    while True:
        pass
except KeyboardInterrupt:
    with open({marks!r}, "a") as marks:
        marks.write(f"{{time.time()}}\\n")
    raise"""


def _workers(kernel: psutil.Process) -> list[int]:
    """The pool's workers: the children of the launch's guardian, the kernel's own child."""
    return [worker.pid for guardian in kernel.children() for worker in guardian.children()]


def test_kernel_interrupt_ends_the_cell_on_every_rank_with_one_keyboard_interrupt(
    tmp_path: Any,
) -> None:
    with real_kernel() as (manager, client):
        kernel = psutil.Process(manager.provisioner.process.pid)
        run_cell(client, "%load_ext notebook_kit")
        run_cell(client, "%%distributed -n 2\nimport time\nkept = 'yes'")
        pids = _workers(kernel)
        assert len(pids) == 2
        marks = tmp_path / "stopped"
        loop = LOOP.format(marks=str(marks))
        messages, interrupted, seconds = _interrupt_while_running(manager, client, loop)
        errors = [m["content"]["ename"] for m in messages if m["msg_type"] == "error"]
        assert errors == ["KeyboardInterrupt"] and seconds < 10
        stopped = [float(line) for line in marks.read_text().split()]
        assert len(stopped) == 2 and max(stopped) - interrupted < 2.0  # every rank, within 2 s
        assert "Traceback" not in _text(messages)  # no worker tracebacks printed
        assert _workers(kernel) == pids  # same workers, names kept
        assert _value(run_cell(client, "%%distributed\nkept")) == "'yes'"

        messages, interrupted, seconds = _interrupt_while_running(
            manager, client, "%%distributed\ntime.sleep(120)"
        )  # blocked in C: the workers are stopped instead
        errors = [m["content"]["ename"] for m in messages if m["msg_type"] == "error"]
        assert errors == ["KeyboardInterrupt"] and seconds < 10, [m["content"] for m in messages]
        assert "the workers were stopped" in _text(messages)
        assert not any(psutil.pid_exists(pid) for pid in pids)  # gone before the cell ended
        after = run_cell(client, "%%distributed\n'kept' in globals()")
        assert _value(after) == "False" and "Starting 2 new workers" in _text(after)
