"""Promises only a real Jupyter kernel can show: ``%debug`` after a launch in the kernel
(docs/guarantees.md), and the README's quickstart notebook through ``notebook-kit execute``."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from tests.kernel_cells import real_kernel
from tests.processes import kernel_environment

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]

ROOT = Path(__file__).resolve().parents[1]

FAILING = """\
from notebook_kit import notebook_launcher

def train(scale):
    local_name = 6 * scale
    raise ValueError(f"bad value {local_name}")

notebook_launcher(train, args=(7,), num_processes=1)
"""


def _run_with_input(client, code: str, answers: list[str], timeout: float = 60.0) -> str:
    """Run ``code``, answering each ``input()`` prompt in turn; return the cell's stream text."""
    msg_id = client.execute(code, allow_stdin=True)
    pending, text = list(answers), []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.stdin_channel.msg_ready():
            request = client.get_stdin_msg(timeout=1)
            if request["msg_type"] == "input_request":
                client.input(pending.pop(0) if pending else "q")
        while client.iopub_channel.msg_ready():
            message = client.get_iopub_msg(timeout=1)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "stream":
                text.append(message["content"]["text"])
            state = message["content"].get("execution_state")
            if message["msg_type"] == "status" and state == "idle":
                return "".join(text)
        time.sleep(0.01)
    raise AssertionError(f"cell did not finish: {code!r}; output so far: {''.join(text)!r}")


def test_debug_after_a_launch_in_the_kernel_lands_in_the_users_frame():
    with real_kernel() as (_, client):
        _run_with_input(client, FAILING, [])
        shown = _run_with_input(client, "%debug", ["p local_name", "p scale", "q"])
        shown = re.sub(r"\x1b\[[0-9;]*m", "", shown)  # IPython colours its listing
        assert re.search(r"^> .*\(5\)train\(\)$", shown, re.MULTILINE), shown  # user's frame
        assert 'raise ValueError(f"bad value {local_name}")' in shown
        assert re.search(r"^42$", shown, re.MULTILINE), shown  # ...with its locals
        assert re.search(r"^7$", shown, re.MULTILINE), shown


@pytest.mark.slow
def test_the_quickstart_through_notebook_kit_execute(tmp_path):
    notebook = tmp_path / "01_quickstart.ipynb"
    shutil.copy(ROOT / "notebooks" / "01_quickstart.ipynb", notebook)
    output = tmp_path / "quickstart-run.ipynb"
    done = subprocess.run(
        [sys.executable, "-m", "notebook_kit", "execute", str(notebook), "-o", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=kernel_environment(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The README: the launch cell as a summary line, then each rank's lines.
    summary = re.search(r"^Finished in [\d.]+ s · (\d+) steps · loss ([\d.]+)$", done.stdout, re.M)
    assert summary, done.stdout[-3000:]
    assert int(summary.group(1)) > 0 and float(summary.group(2)) < 0.1
    assert "rank 1 of 2: 23 batches per epoch" in done.stdout
    home = re.search(r"accuracy of the trained model in this kernel: ([\d.]+)%", done.stdout)
    assert home and float(home.group(1)) >= 95.0
    executed = nbformat.read(output, as_version=4)
    images = [
        o
        for cell in executed.cells
        for o in cell.get("outputs", ())
        if "image/png" in o.get("data", {})
    ]
    assert images, "the final plot was not saved as a PNG"
    assert done.stdout.rstrip().endswith(f"Saved the executed notebook to {output}")
