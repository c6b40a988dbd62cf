"""notebook_launcher inside a real Jupyter kernel: cell output, results and interrupts."""

from __future__ import annotations

import time

import nbformat
import psutil
import pytest
from nbclient import NotebookClient

from tests.kernel_cells import launched_below, real_kernel, run_cell
from tests.notebook_text import cell_text, widget_text
from tests.processes import kernel_environment

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

DEFINE = """\
import os, torch, torch.distributed as dist
from notebook_kit import notebook_launcher

def train(scale):
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} sees {total.item()}")
    return total.item() * scale
"""

LAUNCH = "result = notebook_launcher(train, args=(10,), num_processes=2)\nresult"


def test_notebook_cell_launch_returns_result_and_rank_output():
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(DEFINE), nbformat.v4.new_code_cell(LAUNCH)]
    client = NotebookClient(notebook, timeout=120, kernel_name="python3", store_widget_state=True)
    client.execute(env=kernel_environment())
    launch = notebook.cells[1]
    # The live view shows the banner and each rank's lines in widgets saved with the notebook.
    shown = cell_text(launch) + "\n" + widget_text(notebook)
    assert "Launching 2 processes on CPU (gloo)" in shown
    assert "rank 0 of 2 sees 3.0" in shown
    assert "rank 1 of 2 sees 3.0" in shown
    results = [o for o in launch.outputs if o["output_type"] == "execute_result"]
    assert results and results[0]["data"]["text/plain"] == "30.0"


def test_plain_printer_prefixes_rank_lines_in_the_cell():
    notebook = nbformat.v4.new_notebook()
    launch = LAUNCH.replace("num_processes=2)", "num_processes=2, observer=ConsolePrinter())")
    setup = DEFINE + "from notebook_kit.live.headless import ConsolePrinter\n"
    notebook.cells = [nbformat.v4.new_code_cell(setup), nbformat.v4.new_code_cell(launch)]
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute(env=kernel_environment())
    text = cell_text(notebook.cells[1])
    assert "[rank 0] rank 0 of 2 sees 3.0" in text
    assert "[rank 1] rank 1 of 2 sees 3.0" in text


def _running_below(kernel_pid: int) -> list[psutil.Process]:
    """The kernel's descendants still running: the launch's guardian and its workers (the
    kernel's template, made at import, is not the launch's)."""
    return launched_below(kernel_pid)


def _wait_for_workers(kernel_pid: int, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(_running_below(kernel_pid)) < count:
        assert time.monotonic() < deadline, "workers never started"
        time.sleep(0.05)


def test_kernel_interrupt_stops_workers_and_next_launch_works():
    with real_kernel() as (manager, client):
        kernel_pid = manager.provisioner.process.pid
        run_cell(client, DEFINE + "\nimport signal, time\nbefore = signal.getsignal(signal.SIGINT)")
        msg_id = client.execute("notebook_launcher(lambda: time.sleep(120), num_processes=2)")
        _wait_for_workers(kernel_pid, 3)  # the guardian and 2 workers
        interrupted = time.monotonic()
        manager.interrupt_kernel()
        errors, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline:
            message = client.get_iopub_msg(timeout=30)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "error":
                errors.append(message["content"])
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                break
        # The promise (docs/guarantees.md): every worker ended and the cell done within 2 seconds.
        took = time.monotonic() - interrupted
        assert took < 2.0, f"the interrupted cell took {took:.2f} s to end"
        while _running_below(kernel_pid) and time.monotonic() - interrupted < 2:
            time.sleep(0.02)
        assert not _running_below(kernel_pid), "workers outlived the interrupt"
        assert [error["ename"] for error in errors] == ["KeyboardInterrupt"]
        after = run_cell(client, "print(signal.getsignal(signal.SIGINT) is before)\n" + LAUNCH)
        texts = "".join(m["content"].get("text", "") for m in after if m["msg_type"] == "stream")
        assert texts.startswith("True")
        results = [m for m in after if m["msg_type"] == "execute_result"]
        assert results and results[0]["content"]["data"]["text/plain"] == "30.0"
