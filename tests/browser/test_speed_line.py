"""The speed line in JupyterLab while a run trains: where the time goes and the straggler.

Rank 1 reads its batches slowly (a sleep in its dataset); mid-run, the line under the plot
names it as the straggler with data as its cause, and shows the step split into data,
compute and wait. A screenshot is taken at that moment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer
from tests.browser.test_live_training import _screenshot

pytestmark = pytest.mark.browser

SETUP = """\
import time
import torch
from torch.utils.data import DataLoader, Dataset
import notebook_kit
from notebook_kit import Accelerator, notebook_launcher

class Features(Dataset):
    def __init__(self, delay):
        self.delay = delay

    def __len__(self):
        return 8 * 2 * 400

    def __getitem__(self, index):
        time.sleep(self.delay)
        return torch.randn(32)

def train():
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Features(0.002 if accelerator.process_index == 1 else 0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, 8))
    for step, inputs in enumerate(loader):
        loss = model(inputs).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        notebook_kit.log({"loss": loss}, step=step)
"""
LAUNCH = "notebook_launcher(train, num_processes=2)"


def test_mid_run_the_line_under_the_plot_names_the_straggler_and_splits_the_step(
    page: Any,
    lab_server: LabServer,
    write_notebook: Callable[[str, list[str]], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = write_notebook("speed_line.ipynb", [SETUP, LAUNCH])
    notebook = LabNotebook.open(page, lab_server, path)
    notebook.run_cell(0)
    notebook.wait_for_cell(0, timeout=60)
    notebook.run_cell(1)
    line = notebook.cell(1).locator(".nk-speed")
    line.filter(has_text="straggler: rank 1 (data").wait_for(timeout=60_000)
    shown = line.inner_text()
    assert notebook.kernel_status() == "busy", "the run ended before the line was read"
    assert " = data " in shown and " + compute " in shown and " + wait " in shown, shown
    text = line.locator("div").first  # wrapped, not cut: the straggler is on the screen
    assert text.evaluate("node => node.scrollWidth <= node.clientWidth"), shown
    _screenshot(page, tmp_path_factory.mktemp("speed-screenshots"), "speed_line_mid_run")
    notebook.wait_for_cell(1, timeout=120)
    assert notebook.errors() == {}, notebook.errors()
    summary = notebook.cell(1).locator(".nk-speed").last.inner_text()
    assert "straggler: rank 1 (data" in summary, summary
