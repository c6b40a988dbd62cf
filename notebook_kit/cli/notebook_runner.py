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

    The notebook runs in its own folder, with widget state kept, so the saved copy shows
    what a browser would. Each cell's text output is echoed once the cell has run.

    Args:
        path: The notebook to run.
        output: Where to save the executed notebook (default: not saved).
        timeout: Seconds one cell may take.
        kernel_name: The Jupyter kernel to start.
        echo: Stream for the cells' text output; None to stay quiet.

    Returns:
        The executed notebook.

    Example:
        >>> execute_notebook("notebooks/01_quickstart.ipynb", output="/tmp/quickstart.ipynb")
    """
    source = Path(path)
    notebook = nbformat.read(source, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=int(timeout),
        kernel_name=kernel_name,
        store_widget_state=True,
        resources={"metadata": {"path": str(source.parent.resolve())}},
    )
    if echo is not None:
        client.on_cell_executed = lambda cell, **_: _echo_cell(cell, client.widget_state, echo)
    # The kernel's own log lines (its stderr) are not the notebook's output: keep them out.
    client.execute(stderr=subprocess.DEVNULL)
    if output is not None:
        nbformat.write(notebook, output)
    return notebook


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


def _widget_lines(widgets: dict[str, Any], model_id: str) -> list[str]:
    """The text a widget (and its children) shows, as plain lines; tabs get a title line."""
    state = widgets.get(model_id, {})
    children = [child.removeprefix("IPY_MODEL_") for child in state.get("children", [])]
    titles = list(state.get("titles", []))
    lines: list[str] = []
    for index, child in enumerate(children):
        if index < len(titles) and titles[index]:
            lines.append(f"--- {titles[index]} ---")
        lines += _widget_lines(widgets, child)
    value = state.get("value")
    if isinstance(value, str) and value.strip():
        text = html.unescape(re.sub(r"<[^>]+>", "", value)).strip("\n")
        lines += [line for line in text.splitlines() if line.strip()]
    return lines
