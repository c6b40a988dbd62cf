"""notebooks/07_worker_pool.ipynb in a real kernel: one model trained across cells on a pool."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.notebook_text import cell_text, execute_copy

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "07_worker_pool.ipynb"

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


def _cell(nb, snippet: str):
    return next(c for c in nb.cells if c.cell_type == "code" and snippet in c.source)


def test_the_same_model_trains_across_cells_and_is_evaluated_in_the_kernel(
    tmp_path: Path,
) -> None:
    nb = execute_copy(NOTEBOOK, tmp_path)

    build = cell_text(_cell(nb, "accelerator.prepare(model, optimizer, loader)"))
    assert "Started a pool for %%distributed cells: 2 processes" in build
    assert "[rank 0]\nrank 0 of 2: 15 batches per epoch\n" in build
    assert "[rank 1]\nrank 1 of 2: 15 batches per epoch\n" in build

    # The second cell continues the first one's model: 12 epochs, and a lower loss.
    outputs = _cell(nb, 'group["lr"] = 0.1').outputs
    result = next(o for o in outputs if o["output_type"] == "execute_result")
    epochs, first, second = ast.literal_eval(result["data"]["text/plain"])
    assert epochs == 12 and second < first

    record = cell_text(_cell(nb, "record = notebook_kit.last_run()"))
    assert "epochs of the last cell: [6, 7, 8, 9, 10, 11]" in record

    evaluation = cell_text(_cell(nb, 'pool.pull("weights")'))
    accuracy = re.search(r"test accuracy: ([\d.]+)% on 297 images", evaluation)
    assert accuracy and float(accuracy.group(1)) >= 80.0
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o["output_type"] == "error"]
