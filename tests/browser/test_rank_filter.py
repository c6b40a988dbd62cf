"""Twelve ranks' output in JupyterLab: one tab of grouped lines, and a rank filter typed mid-run.

Every rank prints ``step N done`` at each step; rank 3 also prints a line of its own. While the
run goes, the tab shows ``ranks 0–11: step N done`` (no tab per rank); typing ``3`` in the
filter and Enter shows rank 3's own lines, a filter naming ranks the run lacks says so in red,
and Stop ends the run with the grouped lines saved under the summary. A screenshot is taken
with the filter applied.
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
import notebook_kit
from notebook_kit import notebook_launcher

def train():
    import torch.distributed as dist
    rank = dist.get_rank()
    for step in range(2000):
        print(f"step {step} done")
        if rank == 3 and step % 5 == 0:
            print(f"rank three saved shard {step}")
        time.sleep(0.05)
        if notebook_kit.should_stop():
            return step
"""
LAUNCH = "notebook_launcher(train, num_processes=12)"


def test_twelve_ranks_share_one_tab_of_grouped_lines_and_the_filter_picks_a_rank_mid_run(
    page: Any,
    lab_server: LabServer,
    write_notebook: Callable[[str, list[str]], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = write_notebook("rank_filter.ipynb", [SETUP, LAUNCH])
    notebook = LabNotebook.open(page, lab_server, path)
    notebook.run_cell(0)
    notebook.wait_for_cell(0, timeout=60)
    notebook.run_cell(1)
    cell = notebook.cell(1)
    pane = cell.locator(".nk-rank-groups")
    pane.filter(has_text="ranks 0–11: step 3 done").wait_for(timeout=90_000)
    assert cell.locator(".nk-rank-output .lm-TabBar-tab").count() == 1  # no tab per rank
    typed = cell.locator(".nk-rank-filter input")
    typed.fill("3")
    typed.press("Enter")
    cell.locator(".nk-rank-filter-note").filter(has_text="showing 3 ·").wait_for(timeout=30_000)
    pane.filter(has_text="rank three saved shard").wait_for(timeout=30_000)
    pane.filter(has_not_text="ranks 0–11").wait_for(timeout=30_000)
    assert notebook.kernel_status() == "busy", "the run ended before the filter was seen"
    shown = pane.inner_text()  # rank 3's own lines, as it printed them, no other rank's
    assert "step 3 done\nrank three saved shard" not in shown and "rank 3:" not in shown, shown
    _screenshot(page, tmp_path_factory.mktemp("rank-filter-screenshots"), "rank_filter_mid_run")
    typed.fill("3-40")
    typed.press("Enter")
    note = cell.locator(".nk-rank-filter-note")
    note.filter(has_text="no rank 12–40 in this run").wait_for(timeout=30_000)
    pane.filter(has_text="ranks 0–11: step").wait_for(timeout=30_000)  # grouped again
    cell.locator("button.nk-stop").click()
    notebook.wait_for_cell(1, timeout=120)
    assert notebook.errors() == {}, notebook.errors()
    saved = notebook.output_text(1)
    assert "12 ranks · " in saved and "ranks 0–11: step 0 done" in saved, saved
