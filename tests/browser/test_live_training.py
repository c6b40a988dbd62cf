"""``03_live_training.ipynb`` run from JupyterLab's Run menu: the live view renders and updates."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer
from tests.browser.test_config_panel import dropdown_text

pytestmark = pytest.mark.browser

NOTEBOOK = "03_live_training.ipynb"
LAUNCH = "result = notebook_launcher(train"

# Records every new plot image in the notebook as it appears, with whether its cell was still
# running: a MutationObserver sees each redraw, however briefly it is on screen.
_RECORD_IMAGES = """(panel) => {
    const seen = new Set();
    window.nkImages = [];
    const hash = (text) => {
        let value = 0;
        for (let i = 0; i < text.length; i++) value = (value * 31 + text.charCodeAt(i)) | 0;
        return `${text.length}:${value}`;
    };
    const record = () => panel.querySelectorAll('.jp-Notebook .jp-Cell').forEach((cell, index) => {
        cell.querySelectorAll('.jp-RenderedImage img').forEach((img) => {
            const key = `${index}:${hash(img.getAttribute('src') || '')}`;
            if (seen.has(key)) return;
            seen.add(key);
            const prompt = cell.querySelector('.jp-InputPrompt');
            window.nkImages.push({cell: index, running: prompt.textContent.includes('*')});
        });
    });
    new MutationObserver(record).observe(panel,
        {subtree: true, childList: true, attributes: true, attributeFilter: ['src']});
}"""
_PROGRESS_WIDTHS = """(node) => Array.from(
    node.querySelectorAll('.widget-hprogress .progress-bar'), (bar) => bar.style.width)"""


def _images_while_running(page: Any, cell: int) -> int:
    images = page.evaluate("() => window.nkImages")
    return sum(1 for image in images if image["cell"] == cell and image["running"])


def test_run_all_shows_live_plot_progress_and_rank_output(page: Any, lab_server: LabServer) -> None:
    notebook = LabNotebook.open(page, lab_server, NOTEBOOK)
    launch = notebook.find_cell(LAUNCH)
    notebook.panel.evaluate(_RECORD_IMAGES)
    notebook.run_all()
    notebook.wait_for_all(timeout=240)

    assert notebook.errors() == {}, f"cells with errors: {notebook.errors()}"
    drawn = _images_while_running(page, launch)
    assert drawn >= 3, f"the plot was drawn {drawn} times while the cell ran; expected >= 3"
    cell = notebook.cell(launch)
    assert cell.locator(".jp-RenderedImage img").count() == 1, "the final plot stays, once"
    widths = cell.element_handle().evaluate(_PROGRESS_WIDTHS)
    assert widths == ["100%"], f"progress bar widths: {widths}"
    assert cell.locator(".nk-stop button, button.nk-stop").count() == 1
    assert "Finished in" in cell.locator(".nk-live").inner_text()
    _check_rank_tabs(cell)
    panel = page.locator(".nk-config-panel")
    assert panel.locator(".widget-dropdown select").count() >= 3  # processes, precision, backend
    assert dropdown_text(panel, "num_processes") == "2" and dropdown_text(panel, "live") == "auto"
    result = notebook.outputs(launch)[-1]
    assert result["data"]["text/plain"] == "(100, False)", result


def _check_rank_tabs(cell: Any) -> None:
    """One tab per rank; clicking a tab shows that rank's own lines."""
    output = cell.locator(".nk-rank-output")
    tabs = output.locator(".lm-TabBar-tab")
    assert tabs.all_inner_texts() == ["rank 0", "rank 1"]
    for index in (0, 1):
        tabs.nth(index).click()
        visible = output.locator(".widget-html-content:visible").inner_text()
        assert re.search(r"epoch 3: val_loss \d", visible), visible
