"""Run a notebook top to bottom in a fresh kernel, headless, showing its output as it goes."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

import nbformat
from nbclient import NotebookClient

from notebook_kit.cli.notebook_file import check_writable, read_notebook

__all__ = ["execute_notebook"]


def execute_notebook(
    path: str | os.PathLike[str],
    *,
    output: str | os.PathLike[str] | None = None,
    timeout: float = 600,
    kernel_name: str = "python3",
    echo: TextIO | None = sys.stdout,
) -> nbformat.NotebookNode:
    """Execute every cell of ``path`` in a new kernel; stop at the first error.

    ``output`` is checked before the first cell runs, and the notebook is saved there however
    the run ends: a failed run keeps every cell that ran, the failing one with its error.
    The notebook runs in its own folder, with widget state kept, so the saved copy shows
    what a browser would. Each cell's text output is echoed once the cell has run; widgets
    are echoed as a short summary (``description: value`` per control, the text they show).

    Args:
        path: The notebook to run.
        output: Where to save the executed notebook (default: not saved).
        timeout: Seconds one cell may take.
        kernel_name: The Jupyter kernel to start.
        echo: Stream for the cells' text output; None to stay quiet.

    Returns:
        The executed notebook.

    Raises:
        NotebookFileError: ``path`` is not a notebook, or ``output`` cannot be written.
        nbclient.exceptions.CellExecutionError: A cell raised (the notebook is saved first).

    Example::

        execute_notebook("notebooks/01_quickstart.ipynb", output="/tmp/quickstart.ipynb")
    """
    source = Path(path)
    notebook = read_notebook(source)
    if output is not None:
        check_writable(output)
    client = _ClosingClient(
        notebook,
        timeout=int(timeout),
        kernel_name=kernel_name,
        store_widget_state=True,
        resources={"metadata": {"path": str(source.parent.resolve())}},
    )
    if echo is not None:
        client.on_cell_executed = lambda cell, **_: _echo_cell(cell, client.widget_state, echo)
    finished = False
    try:
        # The kernel's own log lines (its stderr) are not the notebook's output: keep them out.
        client.execute(stderr=subprocess.DEVNULL)
        finished = True
    finally:
        if output is not None:
            _save(notebook, Path(output), finished, echo)
    return notebook


def _save(
    notebook: nbformat.NotebookNode, output: Path, finished: bool, echo: TextIO | None
) -> None:
    """Write the notebook as far as it ran; a failed run says so where it is saved."""
    output.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, output)
    if echo is not None:
        how = "the executed notebook" if finished else "the notebook, up to the cell that failed,"
        echo.write(f"Saved {how} to {output}\n")
        echo.flush()


class _ClosingClient(NotebookClient):
    """Saves the state of the widgets still open at the end, not of those the notebook closed
    (the live view closes its widgets once plain outputs replace them)."""

    def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        if msg["msg_type"] == "comm_close":
            comm_id = msg["content"].get("comm_id")
            self.widget_state.pop(comm_id, None)
            self.widget_buffers.pop(comm_id, None)
        return super().process_message(msg, cell, cell_index)


def _echo_cell(cell: Any, widgets: dict[str, Any], stream: TextIO) -> None:
    for item in cell.get("outputs", []):
        data = item.get("data", {})
        if item["output_type"] == "stream":
            stream.write(item["text"])
        elif _WIDGET_VIEW in data:
            for line in _widget_lines(widgets, data[_WIDGET_VIEW]["model_id"]):
                stream.write(line + "\n")
        elif "text/plain" in data and "image/png" not in data:
            stream.write(data["text/plain"] + "\n")
    stream.flush()


_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_BOXES = {"BoxModel", "VBoxModel", "GridBoxModel"}
_ROWS = {"HBoxModel"}
_TABS = {"TabModel", "AccordionModel", "StackModel"}
_TEXTS = {"HTMLModel", "HTMLMathModel", "LabelModel"}
_SKIPPED = {"ButtonModel", "LinkModel", "DirectionalLinkModel"}
_BLOCK_END = re.compile(
    r"<br\s*/?>|</(p|div|pre|tr|li|h\d|table|details)>|<(pre|summary)[^>]*>", re.I
)


def _widget_lines(widgets: dict[str, Any], model_id: str) -> list[str]:
    """A short readable text of what a widget shows: ``description: value`` for each control,
    the text of HTML and labels, one line per row of a horizontal box, tab titles as headings.

    Buttons and hidden widgets are left out.

    Example:
        >>> state = {"a": {"_model_name": "IntSliderModel", "description": "epochs", "value": 3}}
        >>> _widget_lines(state, "a")
        ['epochs: 3']
    """
    state = widgets.get(model_id, {})
    model = state.get("_model_name", "")
    if model in _SKIPPED or _hidden(widgets, state):
        return []
    children = [child.removeprefix("IPY_MODEL_") for child in state.get("children", [])]
    if model in _ROWS:
        parts = [" ".join(_widget_lines(widgets, child)) for child in children]
        line = " · ".join(part for part in parts if part.strip())
        return [line] if line else []
    if model in _BOXES or model in _TABS:
        titles = list(state.get("titles", [])) if model in _TABS else []
        lines: list[str] = []
        for index, child in enumerate(children):
            if index < len(titles) and titles[index]:
                lines.append(f"--- {titles[index]} ---")
            lines += _widget_lines(widgets, child)
        return lines
    if model in _TEXTS:
        return _html_lines(state.get("value", ""))
    if model == "OutputModel":
        return [
            line
            for output in state.get("outputs", [])
            for line in str(
                output.get("text", output.get("data", {}).get("text/plain", ""))
            ).splitlines()
        ]
    return _control_line(state)


def _hidden(widgets: dict[str, Any], state: dict[str, Any]) -> bool:
    layout = widgets.get(str(state.get("layout", "")).removeprefix("IPY_MODEL_"), {})
    return layout.get("display") == "none" or layout.get("visibility") == "hidden"


def _html_lines(value: object) -> list[str]:
    if not isinstance(value, str):
        return []
    text = html.unescape(re.sub(r"<[^>]+>", "", _BLOCK_END.sub("\n", value)))
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def _control_line(state: dict[str, Any]) -> list[str]:
    """``description: value`` of a control; a selection shows its label."""
    if "value" not in state and "index" not in state:
        return []
    value = state.get("value")
    labels = state.get("_options_labels")
    index = state.get("index")
    if labels and isinstance(index, int) and 0 <= index < len(labels):
        value = labels[index]
    shown = "" if value is None else str(value)
    description = str(state.get("description", "")).strip()
    return [f"{description}: {shown}" if description else shown]
