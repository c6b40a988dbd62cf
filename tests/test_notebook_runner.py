"""`notebook-kit execute` runs a notebook headless and prints what its cells show."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from tests.processes import kernel_environment

pytestmark = pytest.mark.integration

LAUNCH = """\
import torch.distributed as dist
from notebook_kit import notebook_launcher
notebook_launcher(lambda: print(f"hello from rank {dist.get_rank()}"), num_processes=2)
"""


def _run(notebook_path, *extra):
    command = [sys.executable, "-m", "notebook_kit", "execute", str(notebook_path), *extra]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=180, env=kernel_environment()
    )


def test_execute_prints_cell_and_widget_output_and_saves(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("print('first cell')"),
        nbformat.v4.new_code_cell(LAUNCH),
    ]
    path = tmp_path / "run.ipynb"
    nbformat.write(notebook, path)
    done = _run(path, "-o", str(tmp_path / "done.ipynb"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "first cell"
    assert "--- rank 1 ---" in lines and "hello from rank 1" in lines
    executed = nbformat.read(tmp_path / "done.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "first cell\n"


def test_a_failing_cell_stops_the_run_with_status_1(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("1 / 0"), nbformat.v4.new_code_cell("print('x')")]
    nbformat.write(notebook, tmp_path / "bad.ipynb")
    done = _run(tmp_path / "bad.ipynb")
    assert done.returncode == 1
    assert "ZeroDivisionError" in done.stderr and "x" not in done.stdout
