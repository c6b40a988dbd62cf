"""Reading what an executed notebook shows: cell outputs and the text inside widgets."""

from __future__ import annotations

import html
import re

import nbformat


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
