"""notebooks/06_ladder.ipynb in a real kernel: three rungs, each with its live view and accuracy."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.notebook_text import cell_text, execute_copy
from tests.optional import needs
from tests.processes import kernel_environment

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "06_ladder.ipynb"
LAUNCHES = {
    "raw DDP": "notebook_launcher(train_ddp",
    "Accelerator": "notebook_launcher(train_accelerator",
    "Trainer": "notebook_launcher(train_trainer",
}

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
    needs("transformers", what="its Trainer rung"),
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> tuple[nbformat.NotebookNode, float]:
    folder = tmp_path_factory.mktemp("ladder")
    env = kernel_environment()
    env["NOTEBOOK_KIT_CONFIG"] = str(folder / "no-saved-default.json")
    started = time.monotonic()
    nb = execute_copy(NOTEBOOK, folder, env, timeout=240)
    return nb, time.monotonic() - started


def _cell(nb: nbformat.NotebookNode, snippet: str) -> Any:
    return next(cell for cell in nb.cells if cell.cell_type == "code" and snippet in cell.source)


def test_runs_offline_within_three_minutes(executed: tuple[nbformat.NotebookNode, float]) -> None:
    nb, seconds = executed
    assert seconds < 180, f"the notebook took {seconds:.0f} s"
    errors = [
        cell_text(c)
        for c in nb.cells
        if any(o.output_type == "error" for o in c.get("outputs", []))
    ]
    assert not errors


@pytest.mark.parametrize("rung", list(LAUNCHES))
def test_each_rung_shows_the_live_view_and_reaches_the_stated_accuracy(
    executed: tuple[nbformat.NotebookNode, float], rung: str
) -> None:
    nb, _ = executed
    cell = _cell(nb, LAUNCHES[rung])
    # The live view made way for its static end: the summary line and the final plot.
    kinds = [set(output.get("data", {})) for output in cell.outputs]
    assert any("image/png" in kind for kind in kinds), f"{rung}: no final plot"
    plain = [output.get("data", {}).get("text/plain", "") for output in cell.outputs]
    assert any(text.startswith("Finished in") for text in plain), f"{rung}: {plain}"
    text = cell_text(cell)
    found = re.search(rf"{rung}: test accuracy (\d+\.\d)%", text)
    assert found and float(found.group(1)) >= 85.0, text
    # Nothing but the result line is printed into the cell: worker output (and the Trainer's
    # tqdm bars) stays in the live view's rank tabs.
    streams = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    assert "it/s" not in streams and "[rank" not in streams, streams


def test_the_trainer_logs_reach_the_record(executed: tuple[nbformat.NotebookNode, float]) -> None:
    nb, _ = executed
    text = cell_text(_cell(nb, "record = notebook_kit.last_run()"))
    for name in ("'epoch'", "'eval_accuracy'", "'grad_norm'", "'learning_rate'", "'loss'"):
        assert name in text, text
    assert "TensorBoard files: ['events.out.tfevents." in cell_text(
        _cell(nb, LAUNCHES["Accelerator"])
    )
