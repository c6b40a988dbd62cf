"""``03_live_training.ipynb`` run from JupyterLab's Run menu, watched as a user watches it.

Mid-run and at the end the page is photographed and checked: the plot keeps up with the bar,
the cell keeps its height, the kernel shows Busy in the status bar and through
``/api/kernels``, and the end of the run is a summary line, the final plot as an image, the
evaluation table and each rank's output. The notebook saved from Lab, rendered by nbconvert
without widget state (as GitHub shows it), shows the same.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbconvert import HTMLExporter

from tests.browser.lab import LabNotebook
from tests.browser.live_recorder import (
    record,
    sample_kernel_while_live,
    start_recording,
)
from tests.browser.server import LabServer
from tests.browser.test_config_panel import dropdown_text

pytestmark = pytest.mark.browser

NOTEBOOK = "03_live_training.ipynb"
LAUNCH = "result = notebook_launcher(train"
LOGGED_STEPS = 100  # 4 epochs of 25 steps


def _screenshot(page: Any, folder: Path, name: str) -> Path:
    folder = Path(os.environ.get("NOTEBOOK_KIT_SCREENSHOT_DIR", folder))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def test_run_all_shows_a_live_view_that_keeps_up_and_leaves_a_readable_cell(
    page: Any, lab_server: LabServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    shots = tmp_path_factory.mktemp("live-screenshots")
    notebook = LabNotebook.open(page, lab_server, NOTEBOOK)
    launch = notebook.find_cell(LAUNCH)
    start_recording(notebook, launch)
    notebook.run_all()
    cell = notebook.cell(launch)
    mid: dict[str, Any] = {}

    def photograph_mid_run() -> None:
        # One read that does not wait: the live view may make way for the summary between a
        # count() and an inner_text(), which then waited 30 s for an element that was gone.
        texts = cell.locator(".nk-live").all_inner_texts()
        text = texts[0] if texts else ""
        match = re.search(r"(\d+)% · (\d+)/100", text)
        if not mid and match and 30 <= int(match.group(1)) <= 90:
            mid["text"] = text
            mid["stop"] = cell.locator("button.nk-stop").count()
            mid["controls"] = cell.locator(".nk-plot-controls").count()
            mid["path"] = _screenshot(page, shots, "03-mid-run")

    kernel = sample_kernel_while_live(
        notebook, lab_server, launch, timeout=240, on_sample=photograph_mid_run
    )
    notebook.wait_for_all(timeout=240)
    end_shot = _screenshot(page, shots, "03-end")

    assert notebook.errors() == {}, f"cells with errors: {notebook.errors()}"
    samples = [s for s in record(page) if s["live"]]
    _check_plot_kept_up(samples)
    _check_height_stable(samples)
    assert kernel.api and set(kernel.api) == {"busy"}, kernel.api
    assert all("Busy" in bar for bar in kernel.status_bar), kernel.status_bar[:5]
    assert mid, "no moment between 30% and 90% was seen"
    assert "steps/s" in mid["text"] and mid["stop"] == 1 and mid["controls"] == 1, mid
    _check_end_of_run(cell)
    panel = page.locator(".nk-config-panel")
    assert dropdown_text(panel, "num_processes") == "2" and dropdown_text(panel, "live") == "auto"
    assert notebook.outputs(launch)[-1]["data"]["text/plain"] == "(100, False)"
    assert end_shot.exists() and mid["path"].exists()
    _check_saved_notebook_through_nbconvert(page, notebook, lab_server, shots)


def _check_saved_notebook_through_nbconvert(
    page: Any, notebook: LabNotebook, server: LabServer, shots: Path
) -> None:
    """Saved from Lab and rendered by nbconvert without widget state, as GitHub shows it."""
    before = (server.root / NOTEBOOK).stat().st_mtime_ns
    page.evaluate("() => { window.jupyterapp.commands.execute('docmanager:save'); }")
    deadline = time.monotonic() + 30
    while (server.root / NOTEBOOK).stat().st_mtime_ns == before:
        assert time.monotonic() < deadline, "the notebook was not saved"
        time.sleep(0.2)
    time.sleep(0.5)  # the write may still be finishing
    saved = nbformat.read(server.root / NOTEBOOK, as_version=4)
    saved.metadata.pop("widgets", None)
    body, _ = HTMLExporter().from_notebook_node(saved)
    html_path = shots / "03-nbconvert.html"
    html_path.write_text(body)
    page.goto(html_path.as_uri())
    page.wait_for_load_state("load")
    _screenshot(page, shots, "03-nbconvert")
    summaries = page.locator(".nk-summary").all_inner_texts()
    assert len(summaries) == 2 and all(s.startswith("✓ Finished in") for s in summaries)
    loaded = page.evaluate(
        "() => Array.from(document.images).filter(i => i.complete && i.naturalWidth > 0).length"
    )
    assert loaded == 2, "both final plots show as images"
    assert page.locator("table.nk-eval-table").count() == 2
    text = page.locator("body").inner_text()
    assert "rank 1 · 4 lines" in text and "epoch 3: val_loss" in text
    assert "Error displaying widget" not in text and "VBox(" not in text


def _check_plot_kept_up(samples: list[dict[str, Any]]) -> None:
    """By the time the bar is full, the plot has drawn at least 80% of the logged steps."""
    full = next((s for s in samples if s["width"] == "100%"), None)
    assert full is not None, "the bar never showed 100% while the live view was up"
    drawn = (full["lastX"] or 0) + 1
    assert drawn >= 0.8 * LOGGED_STEPS, f"plot at step {drawn} when the bar reached 100%"
    moving = {s["lastX"] for s in samples if s["lastX"] is not None}
    assert len(moving) >= 5, f"the plot was redrawn with only {len(moving)} different ends"


def _check_height_stable(samples: list[dict[str, Any]]) -> None:
    heights = [s["height"] for s in samples if s["height"] > 0]
    assert heights and max(heights) <= 1.1 * min(heights), (min(heights), max(heights))


def _check_end_of_run(cell: Any) -> None:
    """The widgets made way for plain outputs: summary, one image, table, rank output."""
    assert cell.locator(".nk-live").count() == 0
    summary = cell.locator(".nk-summary").inner_text()
    assert re.match(r"✓ Finished in [\d.]+ s · 100 steps · loss \S+ · val_loss \S+$", summary)
    assert cell.locator(".jp-RenderedImage img").count() == 1, "the final plot, once"
    table = cell.locator("table.nk-eval-table")
    assert table.locator("tbody tr").count() == 4  # one row per epoch's evaluation
    ranks = cell.locator(".nk-details details summary").all_inner_texts()
    assert ranks == ["evaluation rounds", "rank 0 · 4 lines", "rank 1 · 4 lines"], ranks
    assert "epoch 3: val_loss" in cell.locator(".nk-details").inner_text()
