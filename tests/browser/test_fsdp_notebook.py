"""``09_fsdp.ipynb`` run from JupyterLab's Run menu: the sharded run draws its plot live, the
notebook runs top to bottom, and the model that came home writes text in the kernel."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.browser.lab import LabNotebook
from tests.browser.live_recorder import plot_ends, start_recording_plot_ends
from tests.browser.server import LabServer

pytestmark = pytest.mark.browser

NOTEBOOK = "09_fsdp.ipynb"


def test_the_sharded_run_draws_live_and_the_notebook_runs_to_the_generated_text(
    page: Any, lab_server: LabServer
) -> None:
    notebook = LabNotebook.open(page, lab_server, NOTEBOOK)
    launch = notebook.find_cell("notebook_launcher(train, args=(model,), num_processes=2)")
    start_recording_plot_ends(notebook, launch)
    notebook.run_all()
    notebook.wait_for_all(timeout=300)

    assert notebook.errors() == {}, f"cells with errors: {notebook.errors()}"
    code = notebook.code_cells()
    unrun = [i for i in code if not re.search(r"\[\d+\]", notebook.cell(i).inner_text())]
    assert not unrun, f"cells that never ran: {unrun}"
    ends = plot_ends(page)
    assert len(ends) >= 2, f"the live plot moved only through {ends}"
    assert ends == sorted(ends), ends
    cell = notebook.cell(launch)
    assert cell.locator(".nk-live").count() == 0, "the live view made way for the final plot"
    assert cell.locator(".nk-summary").inner_text().startswith("✓ Finished in")
    assert cell.locator(".jp-RenderedImage img").count() == 1, "one final plot"

    memory = notebook.output_text(notebook.find_cell("for rank, held in enumerate"))
    ratios = re.findall(r"rank (\d): \d+ KiB .* \(DDP: \d+ KiB on every rank, ([\d.]+)x\)", memory)
    assert [rank for rank, _ in ratios] == ["0", "1"], memory
    assert all(float(ratio) <= 0.55 for _, ratio in ratios), ratios
    last = notebook.find_cell("print(repr(generate(model")
    notebook.cell(last).scroll_into_view_if_needed()  # the screenshot ends on the text
    home = notebook.output_text(last)
    assert "Parameter True" in home, home  # plain parameters, the tie kept
    generated = re.search(r"'the quick(.*)'", home)
    assert generated and "fox" in generated.group(1), home
