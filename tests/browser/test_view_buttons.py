"""The live view's Stacks and Profile buttons, clicked in the page while the launching cell runs."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer
from tests.browser.test_stop_button import LONG_RUN, NOTEBOOK, _wait_for_steps

pytestmark = pytest.mark.browser


def _wait_for_text(cell: Any, selector: str, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while text not in (shown := cell.locator(selector).inner_text()):
        assert time.monotonic() < deadline, f"{selector} never showed {text!r}: {shown!r}"
        time.sleep(0.25)
    return shown


def test_stacks_and_profile_clicked_mid_run_show_under_the_plot_and_stay(
    page: Any, lab_server: LabServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    notebook = LabNotebook.open(page, lab_server, NOTEBOOK)
    definition = notebook.find_cell("def train(")
    for index in (notebook.find_cell("import notebook_kit"), definition):
        notebook.run_cell(index)
        notebook.wait_for_cell(index, timeout=90)
    launch = notebook.insert_cell_below(definition, LONG_RUN.format(call="notebook_launcher"))
    notebook.run_cell(launch)
    cell = notebook.cell(launch)
    _wait_for_steps(cell, 20, timeout=90)
    cell.locator("button.nk-stacks-button").click()
    stacks = _wait_for_text(cell, ".nk-stacks", "rank 1 (pid", timeout=30)
    assert "rank 0 (pid" in stacks and "main thread" in stacks, stacks
    cell.locator("button.nk-profile-button").click()
    profile = _wait_for_text(cell, ".nk-profile", "rank 1 · 5 steps", timeout=60)
    assert "rank 0 · 5 steps" in profile and "self CPU ms" in profile, profile
    image = cell.locator(".nk-profile img")
    assert image.get_attribute("src").startswith("data:image/png;base64,")
    assert image.evaluate("img => img.naturalWidth") > 100  # the timeline, drawn in the page
    shots = tmp_path_factory.getbasetemp() / "screenshots"
    shots.mkdir(exist_ok=True)
    page.screenshot(path=str(shots / "view_buttons_mid_run.png"), full_page=True)
    cell.locator(".nk-profile").screenshot(path=str(shots / "profile_block.png"))
    cell.locator("button.nk-stop").click()
    notebook.wait_for_cell(launch, timeout=60)
    assert notebook.errors() == {}, f"cells with errors: {notebook.errors()}"
    texts = [o.get("data", {}).get("text/plain", "") for o in notebook.outputs(launch)]
    assert any(t.startswith("Stacks at ") and "rank 1 (pid" in t for t in texts), texts
    assert any(t.startswith("Profile\n") and "rank 1 · 5 steps" in t for t in texts), texts
