"""Run a notebook top to bottom in a fresh kernel, headless, showing its output as it goes."""

from __future__ import annotations

import os
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
        client.on_cell_executed = lambda cell, **_: _echo_cell(cell, echo)
    client.execute()
    if output is not None:
        nbformat.write(notebook, output)
    return notebook


def _echo_cell(cell: Any, stream: TextIO) -> None:
    for item in cell.get("outputs", []):
        if item["output_type"] == "stream":
            stream.write(item["text"])
        elif item["output_type"] in ("execute_result", "display_data"):
            text = item.get("data", {}).get("text/plain")
            if text and "image/png" not in item.get("data", {}):
                stream.write(text + "\n")
    stream.flush()
