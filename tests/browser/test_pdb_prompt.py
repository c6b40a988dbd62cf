"""pdb on rank 1, typed at in JupyterLab's input box under the cell, as a user types."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer

pytestmark = pytest.mark.browser

CELLS = [
    "from notebook_kit import notebook_launcher",
    """\
def train():
    import torch, torch.distributed as dist
    rank = dist.get_rank()
    x = torch.tensor([10.0 + rank])
    secret = 40 + rank
    if rank == 1:
        breakpoint()
    dist.all_reduce(x)  # rank 0 waits here while rank 1 is in pdb
    return float(x)

print("result", notebook_launcher(train, num_processes=2))""",
]


def _type_at_the_prompt(notebook: LabNotebook, index: int, number: int, line: str) -> None:
    """Wait for the cell's ``number``-th input box (from 0), naming rank 1; type ``line`` and
    press Enter. An answered box stays in the output, read-only, with what was typed."""
    box = notebook.cell(index).locator(".jp-Stdin-input").nth(number)
    box.wait_for(state="visible", timeout=60_000)
    prompt = notebook.cell(index).locator(".jp-Stdin-prompt").nth(number).inner_text()
    assert "(Pdb rank 1)" in prompt, prompt
    box.fill(line)
    box.press("Enter")


def test_typing_into_rank_1s_pdb_box_prints_its_variable_and_c_ends_the_run(
    page: Any, lab_server: LabServer, write_notebook: Any
) -> None:
    notebook = LabNotebook.open(page, lab_server, write_notebook("pdb.ipynb", CELLS))
    notebook.run_cell(0)
    notebook.wait_for_cell(0, timeout=120)
    notebook.run_cell(1)
    _type_at_the_prompt(notebook, 1, 0, "p secret")
    _type_at_the_prompt(notebook, 1, 1, "c")
    notebook.wait_for_cell(1, timeout=60)
    shown = notebook.output_text(1)
    assert "41" in shown, shown  # rank 1's own variable, printed by pdb under the cell
    assert "result 21.0" in shown, shown  # rank 0's all_reduce met once rank 1 went on
    assert notebook.errors() == {}
