"""The live view's Stop button, clicked in the page while the launching cell runs."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer
from tests.kernel_cells import launched_below

pytestmark = pytest.mark.browser

NOTEBOOK = "03_live_training.ipynb"
# 1000 epochs of 25 steps at 0.04 s: far longer than any test, so only Stop can end it early.
LONG_RUN = 'result = {call}(train, num_processes=2, kwargs={{"epochs": 1000}})'
SHOW = '(result["steps"], result["stopped"])'
TOTAL_STEPS = 25_000


def _steps_shown(cell: Any) -> int:
    """The step count in the cell's progress bar text (``123/25000``)."""
    match = re.search(r"(\d+)/\d+", cell.locator(".nk-live").inner_text())
    return int(match.group(1)) if match else 0


def _wait_for_steps(cell: Any, steps: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _steps_shown(cell) < steps:
        assert time.monotonic() < deadline, f"the run did not reach {steps} steps in {timeout} s"
        time.sleep(0.25)


@pytest.mark.parametrize(
    "call", ["notebook_launcher", "await notebook_launcher_async"], ids=["blocking", "await"]
)
def test_stop_button_ends_run_early_with_normal_result(
    page: Any, lab_server: LabServer, call: str
) -> None:
    notebook = LabNotebook.open(page, lab_server, NOTEBOOK)
    kernel = lab_server.kernel_process(notebook.kernel_id())
    definition = notebook.find_cell("def train(")
    for index in (notebook.find_cell("import notebook_kit"), definition):
        notebook.run_cell(index)
        notebook.wait_for_cell(index, timeout=90)
    launch = notebook.insert_cell_below(definition, LONG_RUN.format(call=call))
    show = notebook.insert_cell_below(launch, SHOW)

    notebook.run_cell(launch)
    cell = notebook.cell(launch)
    _wait_for_steps(cell, 20, timeout=90)  # training is under way and visibly progressing
    cell.locator("button.nk-stop").click()
    clicked = time.monotonic()
    notebook.wait_for_cell(launch, timeout=60)
    assert time.monotonic() - clicked < 20, "the run took too long to stop after the click"

    assert notebook.errors() == {}, f"cells with errors: {notebook.errors()}"
    summary = cell.locator(".nk-summary").inner_text()
    assert summary.startswith("■ Finished in") and summary.endswith("· stopped by you"), summary
    notebook.run_cell(show)  # the kernel is free again and holds the function's result
    notebook.wait_for_cell(show, timeout=30)
    shown = notebook.outputs(show)[-1]["data"]["text/plain"]
    steps, stopped = shown.strip("()").split(", ")
    assert stopped == "True" and 20 <= int(steps) < TOTAL_STEPS, shown
    assert not launched_below(kernel.pid)  # the kernel's clean template aside
