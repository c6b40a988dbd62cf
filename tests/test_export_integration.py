"""The exported quickstart trains under ``notebook-kit launch`` to the notebook's accuracy."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from notebook_kit.cli.export import export_notebook
from tests.notebook_text import execute_copy
from tests.processes import CLI, clean_environment, kernel_environment

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]

QUICKSTART = Path(__file__).resolve().parents[1] / "notebooks" / "01_quickstart.ipynb"
ACCURACY = re.compile(r"test accuracy: ([\d.]+)% on 360 images \(gathered from 2 processes\)")
HOME = re.compile(r"accuracy of the trained model in this kernel: ([\d.]+)%")


def _notebook_accuracy(tmp_path: Path) -> str:
    """The accuracy the notebook's last cell prints for the model trained by the launch."""
    env = {**kernel_environment(), **clean_environment(tmp_path)}
    nb = execute_copy(QUICKSTART, tmp_path, env, store_widget_state=False)
    shown = "".join(
        output.get("text", "") + output.get("data", {}).get("text/plain", "")
        for cell in nb.cells
        for output in cell.get("outputs", [])
    )
    found = HOME.findall(shown)
    assert len(found) == 1, shown
    return found[0]


def test_exported_quickstart_matches_the_notebook(tmp_path):
    script = tmp_path / "train.py"
    result = export_notebook(QUICKSTART, script)
    assert result.has_main and not result.dropped
    env = clean_environment(tmp_path)
    env.pop("PYTEST_CURRENT_TEST", None)
    command = [*CLI, "--num-processes", "2", str(script)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    # The data cell runs on both processes and prints on one, as in the kernel.
    assert done.stdout.count("1437 training images, 360 test images") == 1, done.stdout
    accuracies = ACCURACY.findall(done.stdout)
    assert len(accuracies) == 1, done.stdout  # accelerator.print: rank 0 only
    assert float(accuracies[0]) >= 95.0
    # The cells after the launch ran once, with the trained model.
    assert HOME.findall(done.stdout) == accuracies
    # Same seeds, same data order, one thread per process: the notebook's own number.
    assert accuracies[0] == _notebook_accuracy(tmp_path)
