"""Executing notebooks in tests and reading what they show: cell outputs and widget text."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from tests.processes import kernel_environment


def cell_text(cell: nbformat.NotebookNode) -> str:
    """Streams, plain-text results and error tracebacks of one executed cell."""
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
        if output.get("output_type") == "error":
            parts.append("\n".join(output.get("traceback", [])))
    return "".join(parts)


def widget_text(nb: nbformat.NotebookNode) -> str:
    """Text shown by widgets (the launcher's live view puts each rank's output in one).

    Needs the notebook to have been executed with ``store_widget_state=True``.
    """
    widgets = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    values = [model["state"].get("value", "") for model in widgets.get("state", {}).values()]
    return "\n".join(html.unescape(re.sub(r"<[^>]+>", "", str(value))) for value in values)


def execute_copy(
    notebook: Path,
    folder: Path,
    env: dict[str, str] | None = None,
    timeout: int = 150,
    store_widget_state: bool = True,
) -> nbformat.NotebookNode:
    """Run a copy of ``notebook`` inside ``folder`` in a fresh kernel, keeping widget state."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(notebook, folder / notebook.name)
    nb = nbformat.read(folder / notebook.name, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        store_widget_state=store_widget_state,
        resources={"metadata": {"path": str(folder)}},
    )
    client.execute(env=env or kernel_environment())
    return nb


NODES_NOTEBOOK = [
    "import os, torch, torch.distributed as dist\nfrom notebook_kit import notebook_launcher",
    "def train():\n"
    "    total = torch.ones(1)\n"
    "    dist.all_reduce(total)\n"
    "    return dist.get_world_size(), total.item()",
    "print('node', os.environ.get('GROUP_RANK'), 'trained', notebook_launcher(train))",
]


def export_for_nodes(folder: Path, *options: str) -> Path:
    """A notebook whose launch prints each node's world size and sum, exported with
    ``options`` (``--slurm``, ``--coiled-batch``, ...) to ``folder/train.py``."""
    from nbformat.v4 import new_code_cell, new_notebook

    from notebook_kit.cli import main as cli_main

    notebook = folder / "nodes.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell(c) for c in NODES_NOTEBOOK]), notebook)
    assert cli_main(["export", str(notebook), "-o", str(folder / "train.py"), *options]) == 0
    return folder / "train.py"
