"""Watching a launching cell in the page: what it shows at every change, and the kernel state.

A MutationObserver (plus a 100 ms timer) records, for one cell: time, whether the live view is
there, the progress bar's width, the newest step the plot has drawn (``data-last-x``) and the
height of the output area. While it runs, Python samples the kernel's state as JupyterLab's
status bar shows it and as ``/api/kernels`` reports it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tests.browser.lab import LabNotebook
from tests.browser.server import LabServer

_RECORD = """(cell) => {
    window.nkRecord = [];
    const sample = () => {
        const bar = cell.querySelector('.nk-progress .progress-bar');
        const plot = cell.querySelector('.nk-plot');
        const area = cell.querySelector('.jp-Cell-outputArea');
        window.nkRecord.push({
            t: Date.now(),
            live: !!cell.querySelector('.nk-live'),
            width: bar && bar.offsetParent !== null ? bar.style.width : null,
            lastX: plot && plot.dataset.lastX !== undefined ? Number(plot.dataset.lastX) : null,
            height: area ? area.getBoundingClientRect().height : 0,
        });
    };
    new MutationObserver(sample).observe(cell, {subtree: true, childList: true,
        attributes: true, attributeFilter: ['style', 'data-last-x']});
    window.nkTimer = setInterval(sample, 100);
}"""
# The distinct newest steps a cell's live plot drew (``data-last-x``), sampled every 100 ms
# while the run goes on: a plot drawn only at the end leaves one entry.
_RECORD_PLOT_ENDS = """(cell) => {
    window.nkPlotEnds = [];
    window.nkPlotTimer = setInterval(() => {
        const plot = cell.querySelector('.nk-plot');
        const last = plot && plot.dataset.lastX !== undefined ? Number(plot.dataset.lastX) : null;
        const seen = window.nkPlotEnds;
        if (last !== null && seen[seen.length - 1] !== last) seen.push(last);
    }, 100);
}"""
# JupyterLab's status bar: "Python 3 (ipykernel) | Busy".
_STATUS_BAR = """() => Array.from(document.querySelectorAll('.jp-StatusBar-Widget'),
    (node) => node.textContent).join(' ')"""


@dataclass
class KernelSamples:
    """The kernel state while the live view was on screen, from both sources."""

    api: list[str] = field(default_factory=list)
    status_bar: list[str] = field(default_factory=list)


def start_recording(notebook: LabNotebook, cell: int) -> None:
    notebook.cell(cell).element_handle().evaluate(_RECORD)


def record(page: Any) -> list[dict[str, Any]]:
    return list(page.evaluate("() => window.nkRecord"))


def start_recording_plot_ends(notebook: LabNotebook, cell: int) -> None:
    notebook.cell(cell).element_handle().evaluate(_RECORD_PLOT_ENDS)


def plot_ends(page: Any) -> list[float]:
    """The newest steps drawn, in the order the plot drew them."""
    return list(page.evaluate("() => window.nkPlotEnds"))


def live_view_shown(notebook: LabNotebook, cell: int) -> bool:
    return notebook.cell(cell).locator(".nk-live").count() > 0


def sample_kernel_while_live(
    notebook: LabNotebook, server: LabServer, cell: int, timeout: float, on_sample: Any = None
) -> KernelSamples:
    """Sample the kernel's state every ~0.3 s from the live view's appearance to its end."""
    samples = KernelSamples()
    kernel_id = notebook.kernel_id()
    deadline = time.monotonic() + timeout
    while not live_view_shown(notebook, cell):
        assert time.monotonic() < deadline, "the live view never appeared"
        time.sleep(0.05)
    while live_view_shown(notebook, cell) and time.monotonic() < deadline:
        model = server.request("GET", f"api/kernels/{kernel_id}")
        bar = str(notebook.page.evaluate(_STATUS_BAR))
        if not live_view_shown(notebook, cell):
            break  # the run ended between the two reads
        samples.api.append(model["execution_state"])
        samples.status_bar.append(bar)
        if on_sample is not None:
            on_sample()
        time.sleep(0.3)
    return samples
