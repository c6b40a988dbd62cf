"""Interrupting the kernel from JupyterLab's toolbar stops a launch and leaves the kernel usable."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer
from tests.kernel_cells import is_template

pytestmark = pytest.mark.browser

SETUP = "import time\nfrom notebook_kit import notebook_launcher\nseconds = 120"
LAUNCH = 'notebook_launcher(lambda: time.sleep(seconds) or "rested", num_processes=2)'


def _wait_for_workers(kernel: psutil.Process, count: int, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = [c for c in kernel.children(recursive=True) if not is_template(c)]
        if len(workers) >= count:
            return workers
        time.sleep(0.2)
    raise AssertionError(f"the kernel did not start {count} workers in {timeout} s")


def _live_children(kernel: psutil.Process, timeout: float) -> list[psutil.Process]:
    """The kernel's child processes still alive (not zombies), its clean template aside, after
    up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for child in kernel.children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE and not is_template(child):
                    alive.append(child)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _keyboard_interrupts(outputs: list[dict[str, Any]]) -> tuple[int, str]:
    """Error outputs that are KeyboardInterrupts, and all stream text of the cell."""
    errors = [o for o in outputs if o["output_type"] == "error"]
    errors = [o for o in errors if o["ename"] == "KeyboardInterrupt"]
    streams = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    return len(errors), streams


def test_toolbar_interrupt_stops_workers_and_kernel_stays_usable(
    page: Any, lab_server: LabServer, write_notebook: Callable[[str, list[str]], str]
) -> None:
    path = write_notebook("interrupt.ipynb", [SETUP, LAUNCH])
    notebook = LabNotebook.open(page, lab_server, path)
    kernel = lab_server.kernel_process(notebook.kernel_id())
    notebook.run_cell(0)
    notebook.wait_for_cell(0, timeout=60)

    notebook.run_cell(1)
    workers = _wait_for_workers(kernel, 2, timeout=60)
    page.locator(".nk-live").first.wait_for(state="visible")  # the run is on screen
    started = time.monotonic()
    notebook.interrupt()
    notebook.wait_for_cell(1, timeout=30)
    assert time.monotonic() - started < 15, "the interrupt took too long to end the cell"

    errors, streams = _keyboard_interrupts(notebook.outputs(1))
    assert errors == 1, f"expected one KeyboardInterrupt, got {errors}: {notebook.outputs(1)}"
    assert "KeyboardInterrupt" not in streams, f"workers printed tracebacks:\n{streams}"
    assert "KeyboardInterrupt" in notebook.output_text(1)
    assert "Interrupted after" in notebook.output_text(1)  # the live view's summary line
    left = _live_children(kernel, timeout=3.0)
    assert not left, f"workers still running after the interrupt: {left} (started {workers})"
    assert kernel.is_running() and notebook.kernel_status() == "idle"

    notebook.replace_end_of_cell(0, "120", "1")  # a short run this time
    notebook.run_cell(0)
    notebook.wait_for_cell(0, timeout=30)
    notebook.run_cell(1)
    notebook.wait_for_cell(1, timeout=90)
    assert notebook.errors() == {}
    results = [o for o in notebook.outputs(1) if o["output_type"] == "execute_result"]
    assert results and results[0]["data"]["text/plain"] == "'rested'", notebook.outputs(1)
    assert not _live_children(kernel, timeout=3.0)
