"""A ``%%distributed --noblock`` cell in JupyterLab: its lines keep arriving under it while the
next cell runs, and none land under that next cell."""

from __future__ import annotations

import time
from typing import Any

import nbformat
import pytest

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer

pytestmark = pytest.mark.browser

CELLS = [
    "%load_ext notebook_kit",
    "%%distributed -n 2\nimport time, torch.distributed as dist\nrank = dist.get_rank()",
    "%%distributed --noblock\nfor tick in range(8):\n"
    "    print(f'tick {tick} on {rank}', flush=True)\n    time.sleep(0.5)\n'finished'",
    "import time\ntime.sleep(4)\n'the next cell is done'",
    "%distributed wait",
]


def _open(page: Any, lab_server: LabServer) -> LabNotebook:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    notebook.metadata["kernelspec"] = {
        "display_name": "Python 3", "language": "python", "name": "python3"
    }  # fmt: skip
    nbformat.write(notebook, lab_server.root / "noblock.ipynb")
    return LabNotebook.open(page, lab_server, "noblock.ipynb")


def test_a_noblock_cells_lines_arrive_under_it_while_the_next_cell_runs(
    page: Any, lab_server: LabServer
) -> None:
    notebook = _open(page, lab_server)
    for index in (0, 1):
        notebook.run_cell(index)
        notebook.wait_for_cell(index, timeout=120)
    notebook.run_cell(2)
    notebook.wait_for_cell(2, timeout=30)  # it returned with its handle
    assert "running>" in notebook.output_text(2)
    notebook.run_cell(3)
    seen_while_busy = ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and notebook.kernel_status() != "busy":
        time.sleep(0.05)
    while time.monotonic() < deadline and notebook.kernel_status() == "busy":
        seen_while_busy = notebook.output_text(2)
        time.sleep(0.2)
    assert "tick 4 on 0" in seen_while_busy and "tick 4 on 1" in seen_while_busy, seen_while_busy
    notebook.wait_for_cell(3, timeout=30)
    assert "tick" not in notebook.output_text(3)
    notebook.run_cell(4)
    notebook.wait_for_cell(4, timeout=30)
    assert "'finished'" in notebook.output_text(4)
    shown = notebook.output_text(2)
    assert all(f"tick {t} on {r}" in shown for t in range(8) for r in range(2)), shown
    assert notebook.errors() == {}
