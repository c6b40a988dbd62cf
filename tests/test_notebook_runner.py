"""`notebook-kit execute` runs a notebook headless and prints what its cells show."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from notebook_kit.cli.main import main as cli_main
from notebook_kit.cli.notebook_runner import _widget_lines
from tests.processes import kernel_environment

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


def _model(name: str, **state: object) -> dict[str, object]:
    return {"_model_name": name, "layout": "IPY_MODEL_layout", **state}


def test_widgets_print_as_a_short_readable_summary() -> None:
    children = [f"IPY_MODEL_{name}" for name in ("row", "buttons", "code", "hidden")]
    state = {
        "layout": {"_model_name": "LayoutModel", "display": None},
        "gone": {"_model_name": "LayoutModel", "display": "none"},
        "panel": _model("VBoxModel", children=children),
        "row": _model("HBoxModel", children=["IPY_MODEL_choice", "IPY_MODEL_note"]),
        "choice": _model(
            "DropdownModel", description="num_processes", index=1, _options_labels=["auto", "2"]
        ),
        "note": _model("HTMLModel", value="<i>2 of 2 cores</i>"),
        "buttons": _model("HBoxModel", children=["IPY_MODEL_save", "IPY_MODEL_status"]),
        "save": _model("ButtonModel", description="Save as default"),
        "status": _model("HTMLModel", value=""),
        "code": _model("HTMLModel", value="<b>Python</b><pre>launch(train)\nmore()</pre>"),
        "hidden": {**_model("HTMLModel", value="secret"), "layout": "IPY_MODEL_gone"},
    }
    assert _widget_lines(state, "panel") == [
        "num_processes: 2 · 2 of 2 cores",
        "Python",
        "launch(train)",
        "more()",
    ]


@pytest.mark.integration
@pytest.mark.kernel
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
    assert lines[1].startswith("Finished in ")  # the run's summary, not a widget dump
    assert "--- rank 1 · 1 line ---" in lines and "hello from rank 1" in lines
    executed = nbformat.read(tmp_path / "done.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "first cell\n"
    assert "widgets" not in executed.metadata  # the live view's widgets closed: no stale state
    assert lines[-1] == f"Saved the executed notebook to {tmp_path / 'done.ipynb'}"


@pytest.mark.integration
@pytest.mark.kernel
def test_a_failing_cell_stops_the_run_with_status_1(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("1 / 0"), nbformat.v4.new_code_cell("print('x')")]
    nbformat.write(notebook, tmp_path / "bad.ipynb")
    done = _run(tmp_path / "bad.ipynb")
    assert done.returncode == 1
    assert "ZeroDivisionError" in done.stderr and "x" not in done.stdout


@pytest.mark.integration
@pytest.mark.kernel
def test_a_failing_notebook_is_saved_up_to_its_failing_cell_and_exits_1(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("print('before')"),
        nbformat.v4.new_code_cell("1 / 0"),
        nbformat.v4.new_code_cell("print('after')"),
    ]
    nbformat.write(notebook, tmp_path / "bad.ipynb")
    done = _run(tmp_path / "bad.ipynb", "-o", str(tmp_path / "out" / "bad-run.ipynb"))
    assert done.returncode == 1 and "ZeroDivisionError" in done.stderr
    saved = nbformat.read(tmp_path / "out" / "bad-run.ipynb", as_version=4)
    first, failing, after = saved.cells
    assert first.outputs[0]["text"] == "before\n"
    assert failing.outputs[-1]["output_type"] == "error"
    assert failing.outputs[-1]["ename"] == "ZeroDivisionError"
    assert after.outputs == [] and after.execution_count is None
    assert "up to the cell that failed" in done.stdout


def test_an_unwritable_output_fails_before_the_first_cell_runs(tmp_path, capsys):
    marker = tmp_path / "ran"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(f"open({str(marker)!r}, 'w').write('x')")]
    nbformat.write(notebook, tmp_path / "nb.ipynb")
    (tmp_path / "a-file").write_text("")
    output = tmp_path / "a-file" / "out.ipynb"  # its folder is a file: even root cannot
    assert cli_main(["execute", str(tmp_path / "nb.ipynb"), "-o", str(output)]) == 2
    assert not marker.exists(), "a cell ran before the output was checked"
    error = capsys.readouterr().err
    assert error.startswith("notebook-kit execute: error: cannot save") and "-o" in error
    assert len(error.strip().splitlines()) == 1, error


@pytest.mark.parametrize(
    ("text", "command"), [("not json", "execute"), ("[1, 2]", "execute"), ("[1, 2]", "export")]
)
def test_a_file_that_is_not_a_notebook_gets_one_line(tmp_path, capsys, text, command):
    path = tmp_path / "broken.ipynb"
    path.write_text(text)
    assert cli_main([command, str(path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"notebook-kit {command}: error: {path} is not a readable")
    assert len(error.strip().splitlines()) == 1, error
