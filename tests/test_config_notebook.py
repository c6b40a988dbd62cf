"""notebooks/02_config_panel.ipynb runs top to bottom in a real kernel and launches from a panel."""

from __future__ import annotations

import inspect
from pathlib import Path

import nbformat
import pytest

import notebook_kit
from tests.notebook_text import cell_text, execute_copy
from tests.processes import kernel_environment

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "02_config_panel.ipynb"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]


def _cell(nb: nbformat.NotebookNode, snippet: str) -> nbformat.NotebookNode:
    return next(cell for cell in nb.cells if cell.cell_type == "code" and snippet in cell.source)


def test_panel_notebook_launches_with_the_panel_config(tmp_path: Path) -> None:
    if "config" not in inspect.signature(notebook_kit.notebook_launcher).parameters:
        pytest.skip("notebook_launcher does not take config= yet")
    env = kernel_environment()
    env["NOTEBOOK_KIT_CONFIG"] = str(tmp_path / "config" / "launch.json")
    nb = execute_copy(NOTEBOOK, tmp_path / "notebooks", env=env, timeout=120)

    report = _cell(nb, "notebook_kit.environment()")
    assert "text/html" in report.outputs[0]["data"]
    assert "Fork-safe" in cell_text(report)

    panel_outputs = _cell(nb, "panel = ConfigPanel()").outputs
    assert "application/vnd.jupyter.widget-view+json" in panel_outputs[0]["data"]
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert any(state["state"].get("value") == "0" for state in states.values())  # the seed

    assert "num_processes=2" in cell_text(_cell(nb, 'panel.widgets["num_processes"].value = 2'))
    validation = cell_text(_cell(nb, '"99999"'))
    assert "master_port must be an integer from 1 to 65535" in validation
    assert validation.rstrip().endswith("{}")

    assert "(30.0, 2)" in cell_text(_cell(nb, "panel.launch(train"))
    code = cell_text(_cell(nb, "panel.python_call()"))
    assert 'LaunchConfig(num_processes=2, backend="gloo", seed=0)' in code
    assert "notebook-kit launch --num-processes 2 --backend gloo --seed 0 train.py" in code
    assert not (tmp_path / "config" / "launch.json").exists()  # nothing saved without a click
