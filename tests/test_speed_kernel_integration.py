"""The speed line in a real kernel: made under the plot while the workers train, and kept as
text in the summary that replaces the live view."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kernel_cells import real_kernel, run_cell

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]

CELL = """\
import time, torch
from torch.utils.data import DataLoader, TensorDataset
import notebook_kit
from notebook_kit import Accelerator, notebook_launcher

def train():
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.randn(160, 3)), batch_size=4))
    for step, (inputs,) in enumerate(loader):
        time.sleep(0.03)
        notebook_kit.log({"loss": inputs.pow(2).mean()}, step=step)

notebook_launcher(train, num_processes=2)
print("samples", notebook_kit.last_run().speed.samples)
"""


def _speed_lines(messages: list[dict[str, Any]]) -> list[list[str]]:
    """Per speed widget opened, each value it showed: made, then updated while the run goes."""
    opened = [m for m in messages if m["msg_type"] == "comm_open"]
    widgets = {
        m["content"]["comm_id"]: [m["content"]["data"]["state"].get("value", "")]
        for m in opened
        if "nk-speed" in m["content"]["data"].get("state", {}).get("_dom_classes", ())
    }
    for message in messages:
        content = message["content"]
        if message["msg_type"] == "comm_msg" and content.get("comm_id") in widgets:
            value = content["data"].get("state", {}).get("value")
            if value is not None:
                widgets[content["comm_id"]].append(value)
    return list(widgets.values())


def test_the_speed_line_shows_under_the_plot_mid_run_and_stays_in_the_summary() -> None:
    with real_kernel() as (_, client):
        messages = run_cell(client, CELL, timeout=120)
    widgets = _speed_lines(messages)  # the rates come once each rank has timed a step
    assert len(widgets) == 1 and any("samples/s" in line for line in widgets[0]), widgets
    shown = [m for m in messages if m["msg_type"] == "update_display_data"]
    summary = shown[-1]["content"]["data"]["text/plain"].splitlines()
    assert summary[0].startswith("Finished in"), summary
    assert summary[1].startswith("speed: ") and " samples/s · " in summary[1], summary
    assert "peak memory" in summary[1] and "CPU" in summary[1]
    assert " = data " in summary[1] and " + compute " in summary[1], summary  # where steps went
    printed = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    assert "samples 160" in printed
