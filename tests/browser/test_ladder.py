"""``06_ladder.ipynb`` run from JupyterLab's Run menu: every rung shows its live plot and bar."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer
from tests.optional import needs

pytestmark = [
    pytest.mark.browser,
    needs("transformers", what="its Trainer rung"),
]

NOTEBOOK = "06_ladder.ipynb"
RUNGS = {
    "raw DDP": "notebook_launcher(train_ddp",
    "Accelerator": "notebook_launcher(train_accelerator",
    "Trainer": "notebook_launcher(train_trainer",
}


# For each watched cell, the distinct newest steps its live plot drew (``data-last-x``) and the
# x axes it was drawn against (``data-x-axis``). In the cells marked to switch, the x-axis menu
# is set to ``epoch`` as soon as it shows, as a user picks it.
_RECORD_PLOT_ENDS = """([cells, switching]) => {
    window.nkPlotEnds = cells.map(() => []);
    window.nkXAxes = cells.map(() => []);
    const sample = () => cells.forEach((cell, i) => {
        const plot = cell.querySelector('.nk-plot');
        const last = plot && plot.dataset.lastX !== undefined ? Number(plot.dataset.lastX) : null;
        const seen = window.nkPlotEnds[i];
        if (last !== null && seen[seen.length - 1] !== last) seen.push(last);
        const axis = plot && plot.dataset.xAxis, axes = window.nkXAxes[i];
        if (axis && axes[axes.length - 1] !== axis) axes.push(axis);
        const menu = cell.querySelector('select.nk-x-axis');
        if (switching[i] && menu && menu.offsetParent !== null && !cell.nkSwitched) {
            cell.nkSwitched = true;
            menu.value = 'epoch';
            menu.dispatchEvent(new Event('change'));
        }
    });
    window.nkPlotTimer = setInterval(sample, 100);
}"""


def test_each_rung_draws_its_plot_live_and_ends_with_a_summary(
    page: Any, lab_server: LabServer
) -> None:
    notebook = LabNotebook.open(page, lab_server, NOTEBOOK)
    launches = {rung: notebook.find_cell(snippet) for rung, snippet in RUNGS.items()}
    cells = [notebook.cell(index).element_handle() for index in launches.values()]
    page.evaluate(_RECORD_PLOT_ENDS, [cells, [rung == "Trainer" for rung in launches]])
    notebook.run_all()
    notebook.wait_for_all(timeout=300)

    assert notebook.errors() == {}, f"cells with errors: {notebook.errors()}"
    plot_ends = page.evaluate("() => window.nkPlotEnds")
    x_axes = dict(zip(launches, page.evaluate("() => window.nkXAxes"), strict=True))
    # The Trainer logs an epoch: the switch showed, and the plot, then the PNG, followed it.
    assert x_axes["Trainer"][-1:] == ["epoch"], x_axes
    figures = [o for o in notebook.outputs(launches["Trainer"]) if "image/png" in o.get("data", {})]
    assert figures[0]["data"]["text/plain"].endswith("by epoch>"), figures[0]["data"]
    for (rung, index), ends in zip(launches.items(), plot_ends, strict=True):
        cell = notebook.cell(index)
        assert len(ends) >= 2, f"{rung}: the live plot moved only through {ends}"
        assert cell.locator(".nk-live").count() == 0, f"{rung}: the live view made way"
        summary = cell.locator(".nk-summary").inner_text()
        assert summary.startswith("✓ Finished in"), f"{rung}: {summary}"
        assert cell.locator(".jp-RenderedImage img").count() == 1, f"{rung}: one final plot"
        shown = notebook.output_text(index)
        accuracy = re.search(rf"{rung}: test accuracy (\d+\.\d)%", shown)
        assert accuracy and float(accuracy.group(1)) >= 85.0, shown
