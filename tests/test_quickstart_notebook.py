"""notebooks/01_quickstart.ipynb runs top to bottom in a real kernel with 2 workers."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import kernel_environment
from tests.notebook_text import cell_text, widget_text

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "01_quickstart.ipynb"

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


def test_quickstart_trains_on_two_processes_and_brings_the_model_home(tmp_path: Path) -> None:
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    nb = nbformat.read(tmp_path / NOTEBOOK.name, as_version=4)
    client = NotebookClient(
        nb,
        timeout=150,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    started = time.monotonic()
    client.execute(env=kernel_environment())
    assert time.monotonic() - started < 120

    # Worker output reaches the cell as "[rank r] ..." lines or inside the live-view widgets.
    launch = cell_text(
        next(c for c in nb.cells if "notebook_launcher(train" in c.get("source", ""))
    )
    shown = launch + "\n" + widget_text(nb)
    assert "rank 0 of 2: 23 batches per epoch" in shown
    assert "rank 1 of 2: 23 batches per epoch" in shown
    pattern = r"test accuracy: ([\d.]+)% on 360 images \(gathered from 2 processes\)"
    accuracies = re.findall(pattern, shown)
    assert len(accuracies) == 1, f"accelerator.print prints on rank 0 only:\n{shown}"
    assert float(accuracies[0]) >= 95.0

    kernel = cell_text(nb.cells[-1])
    assert re.search(r"first test image: predicted \d, label \d", kernel)
    home = re.search(r"accuracy of the trained model in this kernel: ([\d.]+)%", kernel)
    assert home and float(home.group(1)) == pytest.approx(float(accuracies[0]), abs=0.05)
