"""``06_ladder.ipynb`` run from JupyterLab's Run menu: every rung shows its live plot and bar."""

from __future__ import annotations

import importlib.util
import re
from typing import Any

import pytest

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer
from tests.browser.test_live_training import _PROGRESS_WIDTHS, _RECORD_IMAGES, _images_while_running

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None,
        reason="its Trainer rung needs transformers: pip install notebook_kit[transformers]",
    ),
]

NOTEBOOK = "06_ladder.ipynb"
RUNGS = {
    "raw DDP": "notebook_launcher(train_ddp",
    "Accelerator": "notebook_launcher(train_accelerator",
    "Trainer": "notebook_launcher(train_trainer",
}


def test_each_rung_draws_its_plot_and_bar_live(page: Any, lab_server: LabServer) -> None:
    notebook = LabNotebook.open(page, lab_server, NOTEBOOK)
    launches = {rung: notebook.find_cell(snippet) for rung, snippet in RUNGS.items()}
    notebook.panel.evaluate(_RECORD_IMAGES)
    notebook.run_all()
    notebook.wait_for_all(timeout=300)

    assert notebook.errors() == {}, f"cells with errors: {notebook.errors()}"
    for rung, index in launches.items():
        cell = notebook.cell(index)
        drawn = _images_while_running(page, index)
        assert drawn >= 2, f"{rung}: the plot was drawn {drawn} times while the cell ran"
        assert cell.locator(".jp-RenderedImage img").count() == 1, f"{rung}: one final plot"
        widths = cell.element_handle().evaluate(_PROGRESS_WIDTHS)
        assert widths == ["100%"], f"{rung}: progress bar widths {widths}"
        assert cell.locator("button.nk-stop").count() == 1, rung
        assert "Finished in" in cell.locator(".nk-live").inner_text(), rung
        shown = notebook.output_text(index)
        accuracy = re.search(rf"{rung}: test accuracy (\d+\.\d)%", shown)
        assert accuracy and float(accuracy.group(1)) >= 85.0, shown
