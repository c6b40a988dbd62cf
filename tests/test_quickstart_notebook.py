"""notebooks/01_quickstart.ipynb runs top to bottom in a real kernel with 2 workers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.notebook_text import cell_text, execute_copy, widget_text

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "01_quickstart.ipynb"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]


def test_quickstart_trains_on_two_processes_and_brings_the_model_home(tmp_path: Path) -> None:
    nb = execute_copy(NOTEBOOK, tmp_path)

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
