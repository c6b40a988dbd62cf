"""Driving a notebook in JupyterLab from Playwright: clicks and keys for actions, the app's
document model (``window.jupyterapp``) for reading results.

Actions go through the page the way a person works (click a cell's prompt, Shift+Enter, the Run
menu, the toolbar's stop button); assertions read the notebook model, which holds the same
outputs the page renders, plus the visible text where what the user sees matters.
"""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported for types only: collecting the tests must work without it
    from playwright.sync_api import Locator, Page

    from tests.browser.server import LabServer

# JavaScript helpers. Each takes [path, ...]; `panel` is the notebook open at `path`.
_PANEL = """const panel = Array.from(window.jupyterapp.shell.widgets('main'))
        .find((widget) => widget.context && widget.context.path === path);"""
_KERNEL_READY = f"""([path]) => {{
    if (!window.jupyterapp) return null;
    {_PANEL}
    const kernel = panel && panel.sessionContext && panel.sessionContext.session
        && panel.sessionContext.session.kernel;
    const ready = kernel && kernel.status === 'idle' && panel.content.widgets.length;
    return ready ? panel.id : null;
}}"""
_CELL_DONE = f"""([path, index]) => {{
    {_PANEL}
    const cell = panel.content.widgets[index];
    const count = cell.model.executionCount;
    const prompt = cell.node.querySelector('.jp-InputPrompt');
    return count !== null && prompt && /\\[\\d+\\]/.test(prompt.textContent)
        && panel.sessionContext.session.kernel.status === 'idle';
}}"""
# Done: the kernel is idle and no cell is queued or running; every code cell ran unless a cell
# failed (Run All stops at the first error, leaving the cells after it unrun).
_ALL_DONE = f"""([path]) => {{
    {_PANEL}
    if (panel.sessionContext.session.kernel.status !== 'idle') return false;
    const cells = panel.content.widgets.filter(cell => cell.model.type === 'code');
    if (cells.some(cell => cell.node.querySelector('.jp-InputPrompt').textContent.includes('*')))
        return false;
    const failed = cells.some(cell => cell.model.outputs.toJSON().some(
        output => output.output_type === 'error'));
    return failed || cells.every(cell => cell.model.executionCount !== null);
}}"""
_OUTPUTS = f"""([path, index]) => {{
    {_PANEL}
    const cell = panel.content.widgets[index];
    return cell.model.type === 'code' ? cell.model.outputs.toJSON() : [];
}}"""
_SOURCES = f"""([path]) => {{
    {_PANEL}
    return panel.content.widgets.map(cell => cell.model.sharedModel.getSource());
}}"""
_TYPES = f"([path]) => {{ {_PANEL} return panel.content.widgets.map(cell => cell.model.type); }}"
_KERNEL_ID = f"([path]) => {{ {_PANEL} return panel.sessionContext.session.kernel.id; }}"
_KERNEL_STATUS = f"([path]) => {{ {_PANEL} return panel.sessionContext.session.kernel.status; }}"


class LabNotebook:
    """One notebook open in JupyterLab.

    Example:
        >>> notebook = LabNotebook.open(page, server, "03_live_training.ipynb")
        >>> notebook.run_cell(1); notebook.wait_for_cell(1)
    """

    def __init__(self, page: Page, path: str, panel_id: str) -> None:
        self.page = page
        self.path = path
        self.panel = page.locator(f'[id="{panel_id}"]')

    @classmethod
    def open(cls, page: Page, server: LabServer, path: str, timeout: float = 90.0) -> LabNotebook:
        """Open ``path`` (relative to the server root) and wait until its kernel is idle.

        Each call uses a new, empty Lab workspace, so no tab of an earlier test is restored
        (restoring one would start its kernel too).
        """
        page.goto(server.url(f"lab/workspaces/test-{uuid.uuid4().hex}/tree/{path}"))
        ready = page.wait_for_function(
            _KERNEL_READY, arg=[path], timeout=timeout * 1000, polling=200
        )
        return cls(page, path, str(ready.json_value()))

    def _evaluate(self, script: str, *args: Any) -> Any:
        return self.page.evaluate(script, [self.path, *args])

    # -- reading -------------------------------------------------------------------------------

    def cells(self) -> Locator:
        """Every cell of the notebook, in order."""
        return self.panel.locator(".jp-Notebook .jp-Cell")

    def cell(self, index: int) -> Locator:
        return self.cells().nth(index)

    def sources(self) -> list[str]:
        return list(self._evaluate(_SOURCES))

    def code_cells(self) -> list[int]:
        """Indices of the code cells."""
        return [i for i, kind in enumerate(self._evaluate(_TYPES)) if kind == "code"]

    def find_cell(self, text: str) -> int:
        """Index of the first cell whose source contains ``text``."""
        for index, source in enumerate(self.sources()):
            if text in source:
                return index
        raise LookupError(f"no cell contains {text!r}")

    def outputs(self, index: int) -> list[dict[str, Any]]:
        """The cell's outputs as nbformat dictionaries (what the page renders)."""
        return list(self._evaluate(_OUTPUTS, index))

    def output_text(self, index: int) -> str:
        """The visible text of the cell's output area."""
        area = self.cell(index).locator(".jp-Cell-outputArea")
        return area.inner_text() if area.count() else ""

    def errors(self) -> dict[int, list[str]]:
        """Cell index -> "ename: evalue" of each error output, for every cell that has one."""
        found: dict[int, list[str]] = {}
        for index in self.code_cells():
            names = [
                f"{output['ename']}: {output['evalue']}"
                for output in self.outputs(index)
                if output["output_type"] == "error"
            ]
            if names:
                found[index] = names
        return found

    def kernel_id(self) -> str:
        return str(self._evaluate(_KERNEL_ID))

    def kernel_status(self) -> str:
        return str(self._evaluate(_KERNEL_STATUS))

    # -- acting --------------------------------------------------------------------------------

    def run_cell(self, index: int) -> None:
        """Select the cell by clicking its prompt and press Shift+Enter, as a person would."""
        self.cell(index).locator(".jp-InputPrompt").first.click()
        self.page.keyboard.press("Shift+Enter")

    def run_all(self) -> None:
        """Run → Run All Cells from the menu bar."""
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()

    def interrupt(self) -> None:
        """Click the notebook toolbar's "Interrupt the kernel" (■) button."""
        self.panel.locator('.jp-Toolbar [data-command="notebook:interrupt-kernel"]').first.click()

    def insert_cell_below(self, index: int, source: str) -> int:
        """Add a code cell below cell ``index`` (key ``b``) and type ``source`` into it."""
        self.cell(index).locator(".jp-InputPrompt").first.click()
        self.page.keyboard.press("Escape")
        self.page.keyboard.press("b")
        self.page.keyboard.press("Enter")  # edit mode in the new cell
        self.page.keyboard.type(source)
        self.page.keyboard.press("Escape")
        return index + 1

    def replace_end_of_cell(self, index: int, old: str, new: str) -> None:
        """Edit the cell's last characters by typing: ``old`` is deleted, ``new`` typed."""
        self.cell(index).locator(".cm-content").click()
        self.page.keyboard.press("Control+End")
        for _ in old:
            self.page.keyboard.press("Backspace")
        self.page.keyboard.type(new)
        self.page.keyboard.press("Escape")  # back to command mode

    # -- waiting -------------------------------------------------------------------------------

    def wait_for_cell(self, index: int, timeout: float) -> None:
        """Wait until the cell shows an execution count and the kernel is idle."""
        self.page.wait_for_function(
            _CELL_DONE, arg=[self.path, index], timeout=timeout * 1000, polling=200
        )

    def wait_for_all(self, timeout: float) -> None:
        """Wait until every code cell has run, or an error ended the run; the kernel is idle."""
        self.page.wait_for_function(_ALL_DONE, arg=[self.path], timeout=timeout * 1000, polling=250)
