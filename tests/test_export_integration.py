"""The exported quickstart trains under ``notebook-kit launch`` to the notebook's accuracy."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from notebook_kit.cli.export import export_notebook
from tests.notebook_text import execute_copy, export_for_nodes
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


def test_the_coiled_batch_script_trains_on_two_tasks_from_coiled_s_variables(tmp_path):
    """train.sh as Coiled Batch runs it: two tasks, each told its number and node 0's address."""
    from tests.processes import free_port

    port = free_port()
    export_for_nodes(tmp_path, "--coiled-batch", "--nodes", "2", "--master-port", str(port))
    batch = tmp_path / "train.sh"
    text = batch.read_text()
    assert "# COILED ntasks 2\n" in text and "# COILED task-on-scheduler true\n" in text
    bin_folder = str(Path(CLI[0]).parent)  # where pip put notebook-kit
    env = clean_environment(
        tmp_path,
        PATH=f"{bin_folder}:{os.environ['PATH']}",
        COILED_BATCH_TASK_COUNT="2",
        COILED_BATCH_SCHEDULER_ADDRESS="127.0.0.1",
    )
    tasks = [
        subprocess.Popen(
            [str(batch)],
            env={**env, "COILED_BATCH_TASK_ID": str(task)},
            cwd="/",  # the script finds its files itself
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for task in (0, 1)
    ]
    outputs = [task.communicate(timeout=300)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs
    assert "node 0 trained (2, 2.0)" in outputs[0], outputs[0]
    assert "node 1 trained (2, 2.0)" in outputs[1], outputs[1]
