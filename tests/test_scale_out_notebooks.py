"""notebooks/04_checkpoint_resume and 05_scale_out run top to bottom in a real kernel."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.notebook_text import execute_copy
from tests.processes import kernel_environment

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]


def _execute(name: str, tmp_path: Path, *companions: str) -> tuple[list[str], float]:
    """Run a copy of notebook ``name`` in ``tmp_path``; the text each code cell showed.

    The kernel's temporary files go to ``tmp_path / "scratch"``.
    """
    for file in companions:
        shutil.copy(NOTEBOOKS / file, tmp_path / file)
    env = kernel_environment()
    env["NOTEBOOK_KIT_CONFIG"] = str(tmp_path / "no-saved-default.json")
    (tmp_path / "scratch").mkdir()
    env["TMPDIR"] = str(tmp_path / "scratch")
    started = time.monotonic()
    nb = execute_copy(NOTEBOOKS / name, tmp_path, env, timeout=240, store_widget_state=False)
    texts = [
        "".join(output.get("text", "") for output in cell.get("outputs", []))
        for cell in nb.cells
        if cell.cell_type == "code"
    ]
    return texts, time.monotonic() - started


def test_checkpoint_resume_notebook(tmp_path):
    texts, seconds = _execute("04_checkpoint_resume.ipynb", tmp_path)
    assert seconds < 180
    shown = "\n".join(texts)
    assert "the launch failed: Rank 1 of 2 failed: RuntimeError: simulated crash at step 7" in shown
    assert "checkpoints on disk: ['checkpoint_4', 'checkpoint_5']" in shown
    assert (
        "Rank 1 failed (RuntimeError: simulated crash at step 7); restarting all workers" in shown
    )
    assert shown.count("same weights as the reference: True") == 2
    assert shown.count("checkpoints kept: ['checkpoint_22', 'checkpoint_23']") == 2


def test_scale_out_notebook(tmp_path):
    texts, seconds = _execute("05_scale_out.ipynb", tmp_path, "01_quickstart.ipynb")
    assert seconds < 180
    shown = "\n".join(texts)
    assert "def main() -> None:" in shown
    assert (
        "torchrun --nproc-per-node 2 --max-restarts 0 --standalone "
        "-m notebook_kit.cli.script_entry quickstart.py"
    ) in shown
    assert "exit status 0" in shown
    assert "--- node 0: exit status 0 ---" in shown and "--- node 1: exit status 0 ---" in shown
    assert "(node 1 of 2, world size 2)" in shown
    final = next(text for text in texts if text.startswith("one node")).splitlines()
    single = final[0].split(": ", 1)[1]
    assert single != "[]"
    assert final[1] == f"two nodes, 1 process each: {single} {single}"
    # Running the notebook leaves nothing behind beside it, nor in the temporary folder.
    assert sorted(path.name for path in tmp_path.glob("*.py")) == []
    assert list((tmp_path / "scratch").glob("notebook_kit_scale_out_*")) == []
