"""``08_cluster.ipynb`` run from JupyterLab's Run menu: a two-node run shows the live view."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.lab import LabNotebook
from tests.browser.live_recorder import plot_ends, start_recording_plot_ends
from tests.browser.server import LabServer
from tests.optional import needs

pytestmark = [pytest.mark.browser, needs("distributed", what="the cluster notebook")]

NOTEBOOK = "08_cluster.ipynb"


def test_the_cluster_run_draws_its_plot_live_and_shows_each_ranks_node(
    page: Any, lab_server: LabServer
) -> None:
    notebook = LabNotebook.open(page, lab_server, NOTEBOOK)
    launch = notebook.find_cell("notebook_launcher(train, args=(model,), cluster=client")
    start_recording_plot_ends(notebook, launch)
    notebook.run_all()
    notebook.wait_for_all(timeout=420)

    assert notebook.errors() == {}, f"cells with errors: {notebook.errors()}"
    ends = plot_ends(page)
    assert len(ends) >= 2, f"the live plot moved only through {ends}"
    cell = notebook.cell(launch)
    assert cell.locator(".nk-summary").inner_text().startswith("✓ Finished in")
    shown = cell.inner_text()
    assert "rank 0 · node 0" in shown and "rank 1 · node 1" in shown, shown
    speed = cell.locator(".nk-speed").last.inner_text()  # the run's line, then one per node
    assert " = data " in speed and " + wait " in speed, speed
    assert "node 0 (rank 0): step " in speed and "node 1 (rank 1): step " in speed, speed
