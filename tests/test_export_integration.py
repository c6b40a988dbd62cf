"""The exported quickstart trains under ``notebook-kit launch`` to the notebook's accuracy."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
from pathlib import Path

import nbformat
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


def test_the_launched_function_prints_on_every_process(tmp_path):
    """The notebook's own prints show once per node, the launched function's on every rank."""
    from nbformat.v4 import new_code_cell, new_notebook

    cells = [
        "import os\nfrom notebook_kit import notebook_launcher\nprint('set up')",
        "def hello():\n    print('hello from rank', os.environ['RANK'], flush=True)",
        "notebook_launcher(hello)\nprint('between')",
        "notebook_launcher(hello)\nprint('after')",
    ]
    notebook = tmp_path / "hello.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell(cell) for cell in cells]), notebook)
    script = export_notebook(notebook).path
    env = clean_environment(tmp_path)
    env.pop("PYTEST_CURRENT_TEST", None)
    command = [*CLI, "--num-processes", "2", "--threads-per-process", "1", str(script)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines.count("hello from rank 0") == lines.count("hello from rank 1") == 2, lines
    assert lines.count("set up") == lines.count("between") == lines.count("after") == 1, lines


NOTEBOOKS = QUICKSTART.parent
# The example notebooks whose export is refused, and the start of the refusal.
REFUSED = {
    "04_checkpoint_resume.ipynb": "cell 8 (`try:`) handles a failed launch (except WorkerError)",
    "05_scale_out.ipynb": "cell 2 (`import shutil`) runs notebook-kit's own commands",
    "07_worker_pool.ipynb": "cell 6 (`%%distributed -n 2`) runs on a WorkerPool",
    "08_cluster.ipynb": "cell 5 (`from notebook_kit import local_cluster`) makes or joins a",
}
# Cells a refused notebook runs without, once its user tags them skip-export as told.
TAGGED = {"04_checkpoint_resume.ipynb": (8, 12)}
_MKDTEMP = "tempfile.mkdtemp() makes one folder for the job"
# The launches each carried notebook makes, and the start of each warning its export gives.
CARRIED = {
    "01_quickstart.ipynb": (1, ()),
    "02_config_panel.ipynb": (1, ()),
    "03_live_training.ipynb": (
        2,
        (
            "left out cell 9 (`record = notebook_kit.last_run()`): reads last_run()",
            "left out cell 10 (`# What the workers logged, averaged over ranks here, is what`): "
            "uses record, which left-out cell 9 binds",
        ),
    ),
    "04_checkpoint_resume.ipynb": (2, (f"cell 2 (`import tempfile`) line 15: {_MKDTEMP}",)),
    "06_ladder.ipynb": (
        3,
        (
            "left out cell 15 (`record = notebook_kit.last_run()`): reads last_run()",
            f"cell 9 (`model = make_model()`) line 2: {_MKDTEMP}",
        ),
    ),
    "09_fsdp.ipynb": (
        1,
        ("left out cell 7 (`@torch.no_grad()`): uses model, which the last launch trained",),
    ),
}
# Carried notebooks that another test already runs as two nodes from this export.
RUN_ELSEWHERE = {
    "01_quickstart.ipynb": "tests/test_scale_out_notebooks.py::test_scale_out_notebook"
}
# Shorter training, through each notebook's own parameters: the test shows that the script
# runs as one job, not how well it trains.
SHRINK = {
    "03_live_training.ipynb": (
        (
            "def train(epochs=4, steps_per_epoch=25, pause=0.04)",
            "def train(epochs=2, steps_per_epoch=5, pause=0.0)",
        ),
    ),
    "04_checkpoint_resume.ipynb": (("TOTAL_STEPS = 24", "TOTAL_STEPS = 6"),),
    "06_ladder.ipynb": (
        (
            "EPOCHS, BATCH_PER_PROCESS, LEARNING_RATE, TARGET = 12, 16, 3e-3, 0.85",
            "EPOCHS, BATCH_PER_PROCESS, LEARNING_RATE, TARGET = 1, 16, 3e-3, 0.0",
        ),
    ),
    "09_fsdp.ipynb": (("def train(model, steps=120)", "def train(model, steps=10)"),),
}


def _export_or_refusal(notebook: Path, tmp_path: Path) -> tuple[int, str]:
    from notebook_kit.cli import main as cli_main

    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        status = cli_main(["export", str(notebook), "-o", str(tmp_path / "job.py")])
    return status, said.getvalue()


def _run_on_two_nodes(script: Path, tmp_path: Path) -> list[str]:
    """The script as its batch script runs it: one notebook-kit launch per node, here two
    nodes of one process on loopback."""
    from tests.processes import free_port

    (tmp_path / "scratch").mkdir()
    env = clean_environment(tmp_path, TMPDIR=str(tmp_path / "scratch"))
    env.pop("PYTEST_CURRENT_TEST", None)
    port = str(free_port())
    where = ["--num-nodes", "2", "--master-addr", "127.0.0.1", "--master-port", port]
    nodes = [
        subprocess.Popen(
            [*CLI, *where, "--node-rank", rank, "--threads-per-process", "1", str(script)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in ("0", "1")
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [out[-3000:] for out in outputs]
    return outputs


@pytest.mark.parametrize("name", sorted(path.name for path in NOTEBOOKS.glob("*.ipynb")))
def test_every_example_notebook_exports_to_a_script_that_runs_on_two_nodes_or_is_refused(
    name, tmp_path
):
    notebook = NOTEBOOKS / name
    status, said = _export_or_refusal(notebook, tmp_path)
    if name in REFUSED:
        assert status == 2 and f"notebook-kit export: error: {REFUSED[name]}" in said, said
        assert not (tmp_path / "job.py").exists()
        if name not in TAGGED:
            return
        nb = nbformat.read(notebook, as_version=4)
        for number in TAGGED[name]:
            nb.cells[number - 1].metadata["tags"] = ["skip-export"]
        notebook = tmp_path / name
        nbformat.write(nb, notebook)
        status, said = _export_or_refusal(notebook, tmp_path)
    launches, warnings = CARRIED[name]
    assert status == 0, said
    assert said.count("\nwarning: ") == len(warnings), said
    for warning in warnings:
        assert f"\nwarning: {warning}" in said, said
    script = tmp_path / "job.py"
    if name in RUN_ELSEWHERE:
        return
    for old, new in SHRINK.get(name, ()):
        assert old in script.read_text()
        script.write_text(script.read_text().replace(old, new))
    outputs = _run_on_two_nodes(script, tmp_path)
    # Each launch ran once, as one job of two ranks: not once per process, nor as two jobs.
    banner = "Running under torchrun as rank 0 of 2"
    assert sum(out.count(banner) for out in outputs) == launches, outputs
