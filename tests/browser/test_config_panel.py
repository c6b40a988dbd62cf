"""``02_config_panel.ipynb`` in JupyterLab: the ConfigPanel renders, and what a person picks in
it is what the launch uses."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer

pytestmark = pytest.mark.browser

NOTEBOOK = "02_config_panel.ipynb"
# The selected option's label, once the widget view has filled in its options.
_SELECTED_TEXT = (
    "(select) => select.selectedIndex >= 0 ? select.options[select.selectedIndex].text : null"
)


def _field(panel: Any, kind: str, name: str) -> Any:
    """The input of the panel's ``name`` field; ``kind`` is the widget's CSS class suffix."""
    return panel.locator(f".nk-field-{name}").locator("select" if kind == "dropdown" else "input")


def dropdown_text(panel: Any, name: str, timeout: float = 10.0) -> str:
    """The label shown by the ``name`` dropdown."""
    select = _field(panel, "dropdown", name)
    deadline = time.monotonic() + timeout
    while (text := select.evaluate(_SELECTED_TEXT)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return str(text)


def _result(notebook: LabNotebook, index: int) -> str:
    results = [o for o in notebook.outputs(index) if o["output_type"] == "execute_result"]
    assert results, f"no result in cell {index}: {notebook.outputs(index)}"
    return str(results[-1]["data"]["text/plain"])


def test_run_all_renders_panel_with_values_set_from_code(page: Any, lab_server: LabServer) -> None:
    notebook = LabNotebook.open(page, lab_server, NOTEBOOK)
    notebook.run_all()
    notebook.wait_for_all(timeout=180)

    panel = page.locator(".nk-config-panel")
    assert panel.count() == 1
    assert panel.locator(".widget-dropdown select").count() >= 3  # processes, precision, backend
    assert panel.locator(".widget-text input").count() >= 3
    shown = {name: dropdown_text(panel, name) for name in ("num_processes", "backend")}
    assert shown == {"num_processes": "2", "backend": "gloo"}, shown
    assert _field(panel, "text", "seed").input_value() == "0"
    assert panel.locator(".nk-error").count() == 0, "a field is marked invalid"
    cut = panel.locator(".widget-label").evaluate_all(
        "(labels) => labels.filter((l) => l.scrollWidth > l.clientWidth).map((l) => l.textContent)"
    )
    assert cut == [], f"labels cut short: {cut}"
    assert "num_processes=2" in panel.locator("pre").first.inner_text()
    assert notebook.errors() == {}, f"cells with errors: {notebook.errors()}"
    assert _result(notebook, notebook.find_cell("panel.launch(")) == "(30.0, 2)"


def test_values_picked_in_panel_are_used_by_launch(page: Any, lab_server: LabServer) -> None:
    notebook = LabNotebook.open(page, lab_server, NOTEBOOK)
    for text in ("notebook_kit.environment()", "panel = ConfigPanel()"):
        notebook.run_cell(notebook.find_cell(text))
        notebook.wait_for_cell(notebook.find_cell(text), timeout=90)
    panel = page.locator(".nk-config-panel")
    shown = dropdown_text(panel, "num_processes")
    assert shown == "auto", f"num_processes shows {shown!r}"  # one process on a CPU-only kernel

    _field(panel, "dropdown", "num_processes").select_option(label="2")
    seed = _field(panel, "text", "seed")
    seed.click()
    seed.fill("7")
    seed.press("Enter")  # the seed box sends its value on Enter (continuous_update=False)
    code = panel.locator("pre").first
    code.filter(has_text="seed=7").wait_for()  # the kernel saw both changes and redrew the call
    assert "num_processes=2" in code.inner_text()

    # Skip the cells that set values from code: launch with what was clicked and typed.
    for text in ("def train(", "panel.launch("):
        notebook.run_cell(notebook.find_cell(text))
        notebook.wait_for_cell(notebook.find_cell(text), timeout=120)
    launch = notebook.find_cell("panel.launch(")
    assert notebook.errors() == {}, f"cells with errors: {notebook.errors()}"
    # (10 * (1 + 2), world size) from the workers: two ranks, as picked in the dropdown.
    assert _result(notebook, launch) == "(30.0, 2)"
