"""The Stacks button: every rank's stacks, asked from the view, shown under the plot.

A click only notes itself (it runs on the kernel subshell that serves the view's controls);
the next refresh, on the kernel's main thread, asks the run for its ranks' stacks without
waiting (the future ``ask_stacks`` returns) and a later refresh shows the answer in a block of
fixed height under the plot, so nothing below it moves. The last answer stays in the saved
notebook as plain text under the summary, and in ``last_run().panels["stacks"]``.

This package may not import the launch's (which imports it), so the launch hands its ways of
asking the run in progress here when it is loaded (:func:`answer_asks`).
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from typing import Any

from notebook_kit.live.panels import Panel

__all__ = ["StacksPanel", "answer_asks", "asker"]

BLOCK_PIXELS = 270  # the block's height with its margins: the view grows by it, once
ASK_SECONDS = 2.0  # the ranks' time to answer: a blocked rank answers from a thread of its own
_BLOCK_STYLE = (
    f"height:{BLOCK_PIXELS - 10}px;overflow:auto;margin:4px 0;padding:4px 6px;"
    "border:1px solid #ddd;"
    "font-size:11px;line-height:14px;white-space:pre;background:#fafafa"
)
_asks: dict[str, Callable[..., Any]] = {}  # "stacks", "profile": the launch's askers


def answer_asks(**asks: Callable[..., Any]) -> None:
    """The launch's ways to ask the run in progress, each returning a future (set on import
    of the module that defines them).

    Example::

        answer_asks(stacks=ask_stacks)
    """
    _asks.update(asks)


def asker(name: str) -> Callable[..., Any] | None:
    """The launch's way to ask ``name`` of the run in progress, None where none was given."""
    return _asks.get(name)


def block_layout() -> Any:
    """A block's own layout: hidden until first shown, then of fixed height, never shrunk."""
    import ipywidgets as widgets

    return widgets.Layout(display="none", height=f"{BLOCK_PIXELS}px", flex="0 0 auto")


def show_block(view: Any, block: Any) -> None:
    """Show ``block`` the first time: the view's box, of fixed height, grows by its height
    (once, on a click), so nothing else in it is squeezed."""
    if block.layout.display != "none":
        return
    box = getattr(view, "box", None)
    height = str(getattr(getattr(box, "layout", None), "height", "") or "")
    if height.endswith("px"):
        box.layout.height = f"{float(height[:-2]) + BLOCK_PIXELS:g}px"
    block.layout.display = None


class StacksPanel(Panel):
    """A Stacks button beside Stop; every rank's stacks in a block under the plot."""

    name = "stacks"
    place = "header"

    def __init__(self) -> None:
        self.button: Any = None
        self.block: Any = None
        self._view: Any = None
        self.texts: dict[int, str] | None = None  # the last answer, rank by rank
        self.note: str | None = None  # what the answer leaves out (py-spy's frames)
        self.asked_at = ""  # the wall time of the last answer's question
        self._clicks = self._seen = 0
        self._future: Any = None
        self._shown = ""

    def build(self, view: Any) -> list[tuple[str, Any]]:
        import ipywidgets as widgets  # with the notebook view only

        self.button = widgets.Button(
            description="Stacks",
            icon="align-left",
            tooltip="Every rank's stack now, shown under the plot (the run goes on)",
            layout=view.shared.layout,
            _dom_classes=("nk-stacks-button",),
        )
        self.button.on_click(self._clicked)
        # Hidden until the first click, then of fixed height: its own layout, shown once.
        self.block = view.shared.html("", ("nk-stacks",), block_layout())
        self._view = view
        self._shown = ""
        # The block goes with the tabs, just above them: under the plot and the lines that appear
        # there (the speed line keeps its place under the plot).
        return [("header", self.button), ("tab", self.block)]

    @property
    def controls(self) -> list[Any]:  # type: ignore[override]
        return [self.button] if self.button is not None else []

    def _clicked(self, _: Any) -> None:
        # On the route's subshell while the cell runs: note the click only (draw() asks).
        self._clicks += 1

    def draw(self) -> None:
        if self._clicks != self._seen and self._future is None:
            self._seen = self._clicks
            self._ask()
        future = self._future
        if future is not None and future.done():
            self._future = None
            self._answered(future)

    def _ask(self) -> None:
        ask = asker("stacks")
        if ask is None:
            self._show("This run cannot be asked for its stacks.")
            return
        self.asked_at = time.strftime("%H:%M:%S")
        try:
            self._future = ask(timeout=ASK_SECONDS)
        except RuntimeError as error:  # the run ended just now
            self._show(str(error))
            return
        self._show(f"Asking every rank for its stacks ({self.asked_at})…")

    def _answered(self, future: Any) -> None:
        try:
            answer = future.result()
        except Exception as error:  # the run ended while the ranks were asked
            self._show(f"No stacks: {error}")
            return
        self.texts, self.note = dict(answer), getattr(answer, "note", None)
        self._show(self._text())

    def _text(self) -> str:
        parts = [f"Stacks at {self.asked_at}", *(self.texts or {}).values()]
        return "\n\n".join([*parts, *([self.note] if self.note else [])])

    def _show(self, text: str) -> None:
        if self.block is None or text == self._shown:
            return
        self._shown = text
        show_block(self._view, self.block)
        self.block.value = f'<div style="{_BLOCK_STYLE}">{html.escape(text)}</div>'

    def output(self) -> dict[str, Any] | None:
        """The last stacks taken, as plain text under the summary of the saved notebook."""
        return {"text/plain": self._text()} if self.texts is not None else None

    def record(self) -> Any:
        """``{rank: text}`` of the last stacks taken from the view, None if none were."""
        return self.texts
