"""notebooks/03_live_training.ipynb in a real kernel: the live view updates while workers run."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

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
    return msg["msg_type"] in ("display_data", "update_display_data") and (
        "image/png" in msg["content"].get("data", {})
    )


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
    # Several redraws, most of them well before the cell ended (not one burst at the end).
    assert len([t for t in plots if t < idle - 0.5]) > 1, plots
    assert len([t for t in progress if t < idle - 0.5]) > 1
    assert plots[-1] - plots[0] > 1.0


def test_final_plot_and_widgets_stay_in_the_saved_notebook(
    executed: tuple[Any, _TimedClient],
) -> None:
    nb, _ = executed
    outputs = nb.cells[_index(nb, "result = notebook_launcher(train")].outputs
    kinds = [set(output.get("data", {})) for output in outputs]
    assert any("image/png" in kind for kind in kinds)
    assert any("application/vnd.jupyter.widget-view+json" in kind for kind in kinds)
    assert not [o for o in outputs if o.output_type == "stream"], "worker lines leaked"
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    panes = [s["state"].get("value", "") for s in states.values() if s["model_name"] == "HTMLModel"]
    assert any("epoch 3: val_loss" in pane for pane in panes)  # rank output, grouped by rank


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
