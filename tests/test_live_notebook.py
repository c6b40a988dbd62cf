"""notebooks/03_live_training.ipynb in a real kernel: the live view updates while workers run,
and the saved notebook shows the run without widget state (nbconvert's HTML, as GitHub would)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter

from tests.processes import kernel_environment

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "03_live_training.ipynb"

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


class _TimedClient(NotebookClient):
    """Remembers when each message of each cell arrived."""

    arrivals: list[tuple[float, int, dict[str, Any]]]

    def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        self.arrivals.append((time.monotonic(), cell_index, msg))
        return super().process_message(msg, cell, cell_index)


def _index(nb: nbformat.NotebookNode, snippet: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and snippet in c.source)


def _is_plot(msg: dict[str, Any]) -> bool:
    """New points for the browser plot."""
    data = msg["content"].get("data", {})
    return msg["msg_type"] == "comm_msg" and "points" in data.get("content", {})


def _is_progress_update(msg: dict[str, Any]) -> bool:
    data = msg["content"].get("data", {})
    return msg["msg_type"] == "comm_msg" and "value" in data.get("state", {})


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, _TimedClient]:
    work = tmp_path_factory.mktemp("notebooks")
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    nb = nbformat.read(work / NOTEBOOK.name, as_version=4)
    client = _TimedClient(
        nb,
        timeout=120,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(work)}},
    )
    client.arrivals = []
    client.execute(env=kernel_environment())
    nbformat.write(nb, work / "executed.ipynb")
    return nbformat.read(work / "executed.ipynb", as_version=4), client


def test_display_updates_arrive_while_the_cell_runs(executed: tuple[Any, _TimedClient]) -> None:
    nb, client = executed
    launch = _index(nb, "result = notebook_launcher(train")
    messages = [(t, msg) for t, i, msg in client.arrivals if i == launch]
    idle = max(t for t, msg in messages if msg["msg_type"] == "status")
    plots = [t for t, msg in messages if _is_plot(msg)]
    progress = [t for t, msg in messages if _is_progress_update(msg)]
    # Many small pushes spread over the run (not one burst at the end).
    assert len([t for t in plots if t < idle - 0.5]) > 5, plots
    assert len([t for t in progress if t < idle - 0.5]) > 1
    assert plots[-1] - plots[0] > 1.0


def test_the_saved_notebook_shows_the_run_as_plain_outputs(
    executed: tuple[Any, _TimedClient],
) -> None:
    nb, _ = executed
    outputs = nb.cells[_index(nb, "result = notebook_launcher(train")].outputs
    kinds = [sorted(output.get("data", {})) for output in outputs]
    assert kinds == [
        ["text/html", "text/plain"],  # the summary line, where the live widget was
        ["image/png", "text/plain"],  # the final plot
        ["text/html", "text/plain"],  # evaluation table and each rank's output
        ["text/plain"],  # the cell's result
    ]
    assert outputs[0]["data"]["text/plain"].startswith("Finished in ")
    assert " · 100 steps · loss " in outputs[0]["data"]["text/plain"]
    details = outputs[2]["data"]["text/plain"]
    assert details.startswith("evaluation rounds:\nstep  loss (avg)") and "val_loss" in details
    assert "--- rank 1 · 4 lines ---\nepoch 0: val_loss" in details


def test_nbconvert_html_without_widget_state_shows_summary_plot_table_and_ranks(
    executed: tuple[Any, _TimedClient],
) -> None:
    nb, _ = executed
    nb.metadata.pop("widgets", None)  # as GitHub and most viewers see it
    body, _ = HTMLExporter().from_notebook_node(nb)
    launch = body[body.index('class="nk-summary"') :]  # the first launch's cell onwards
    assert "Finished in" in launch[:400] and "100 steps" in launch[:400]
    assert 'src="data:image/png' in launch
    assert '<table class="nk-eval-table"' in launch
    assert "<summary>rank 1 · 4 lines</summary>" in launch and "epoch 3: val_loss" in launch
    assert "widget-view" not in launch


def test_last_run_matches_what_the_workers_logged(executed: tuple[Any, _TimedClient]) -> None:
    nb, _ = executed
    check = nb.cells[_index(nb, "assert means == record.metrics")]
    assert "recorded metrics match: ['loss', 'val_loss']" in check.outputs[0]["text"]
    summary = nb.cells[_index(nb, "record = notebook_kit.last_run()")].outputs[0]["text"]
    assert "exit codes: {0: 0, 1: 0} stopped: False dropped: 0" in summary


def test_awaited_and_quiet_runs(executed: tuple[Any, _TimedClient]) -> None:
    nb, _ = executed
    awaited = nb.cells[_index(nb, "await notebook_launcher_async")].outputs
    assert awaited[-1]["data"]["text/plain"] == "(50, False)"
    quiet = nb.cells[_index(nb, "live=False")].outputs
    assert [o.output_type for o in quiet] == ["execute_result"]
    assert quiet[0]["data"]["text/plain"] == "25"
