"""A %%distributed training cell in JupyterLab: the Stop button and the toolbar's interrupt.

Both run on notebooks/07_worker_pool.ipynb's pool, after its first training cell, so the
workers hold a model, optimizer and loader that must survive (Stop) or be reported lost.
"""

from __future__ import annotations

import time
from typing import Any

import nbformat
import psutil
import pytest

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer
from tests.kernel_cells import launched_below

pytestmark = pytest.mark.browser

NOTEBOOK = "07_worker_pool.ipynb"
# Far longer than any test: only Stop or an interrupt ends it early.
LONG_CELL = """\
%%distributed
import time
steps = 0
for epoch in range(1000):
    for inputs, targets in loader:
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"loss": loss.item()}, step=steps)
        steps += 1
        time.sleep(0.02)
        if accelerator.should_stop:
            break
    else:
        continue
    break
steps"""
AFTER = "%%distributed\n(steps > 0, len(history))"


def _open_with_a_trained_model(
    page: Any, lab_server: LabServer, extra: list[str]
) -> tuple[LabNotebook, int]:
    """A copy of the notebook with ``extra`` cells after its first training cell, run up to
    that cell; returns the index of the first extra cell.

    The cells are written into the file: typed into the editor, they would be auto-indented.
    """
    nb = nbformat.read(lab_server.root / NOTEBOOK, as_version=4)
    trained = next(i for i, c in enumerate(nb.cells) if "first_loss = train(" in c.source)
    nb.cells[trained + 1 : trained + 1] = [nbformat.v4.new_code_cell(s) for s in extra]
    nbformat.write(nb, lab_server.root / f"long_{NOTEBOOK}")
    notebook = LabNotebook.open(page, lab_server, f"long_{NOTEBOOK}")
    for index in notebook.code_cells():
        if index > trained:
            break
        notebook.run_cell(index)
        notebook.wait_for_cell(index, timeout=120)
    assert notebook.errors() == {}, notebook.errors()
    return notebook, trained + 1


def _workers(kernel: psutil.Process) -> list[int]:
    return sorted(c.pid for c in launched_below(kernel.pid))  # the clean template aside


def test_stop_button_ends_a_distributed_cell_and_the_workers_keep_the_model(
    page: Any, lab_server: LabServer
) -> None:
    notebook, long_cell = _open_with_a_trained_model(page, lab_server, [LONG_CELL, AFTER])
    after = long_cell + 1
    kernel = lab_server.kernel_process(notebook.kernel_id())
    workers = _workers(kernel)

    notebook.run_cell(long_cell)
    cell = notebook.cell(long_cell)
    cell.locator("button.nk-stop").wait_for(state="visible", timeout=60_000)
    time.sleep(2.0)  # training is under way: 20 ms per step at least
    cell.locator("button.nk-stop").click()
    clicked = time.monotonic()
    notebook.wait_for_cell(long_cell, timeout=60)
    assert time.monotonic() - clicked < 20, "the cell took too long to stop after the click"

    assert notebook.errors() == {}, notebook.errors()
    assert "stopped by you" in cell.locator(".nk-summary").inner_text()
    results = [o for o in notebook.outputs(long_cell) if o["output_type"] == "execute_result"]
    assert results and 1 <= int(results[0]["data"]["text/plain"]) < 15_000
    notebook.run_cell(after)  # same workers, same names: the model trained on
    notebook.wait_for_cell(after, timeout=30)
    assert notebook.outputs(after)[-1]["data"]["text/plain"] == "(True, 6)"
    assert _workers(kernel) == workers


def test_toolbar_interrupt_ends_a_distributed_cell_with_one_keyboard_interrupt(
    page: Any, lab_server: LabServer
) -> None:
    cells = [LONG_CELL, "%%distributed\nimport torch\n2 + 2"]
    notebook, long_cell = _open_with_a_trained_model(page, lab_server, cells)
    after = long_cell + 1
    kernel = lab_server.kernel_process(notebook.kernel_id())
    workers = _workers(kernel)

    notebook.run_cell(long_cell)
    notebook.cell(long_cell).locator("button.nk-stop").wait_for(state="visible", timeout=60_000)
    started = time.monotonic()
    notebook.interrupt()
    notebook.wait_for_cell(long_cell, timeout=30)
    assert time.monotonic() - started < 15, "the interrupt took too long to end the cell"

    outputs = notebook.outputs(long_cell)
    errors = [o["ename"] for o in outputs if o["output_type"] == "error"]
    assert errors == ["KeyboardInterrupt"], outputs
    streams = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    assert "Traceback" not in streams, f"workers printed tracebacks:\n{streams}"
    assert "Interrupted" in streams  # and it says what became of the workers
    if "the workers were stopped" in streams:  # a rank was inside a collective: restarted
        assert not set(_workers(kernel)) & set(workers)
    else:
        assert _workers(kernel) == workers
    notebook.run_cell(after)
    notebook.wait_for_cell(after, timeout=90)
    assert notebook.outputs(after)[-1]["data"]["text/plain"] == "4"
    assert kernel.is_running() and notebook.kernel_status() == "idle"
