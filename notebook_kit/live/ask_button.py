"""A button beside Stop that asks the run in progress for something, and a block to show it.

A click only notes itself (it runs on the kernel subshell that serves the view's controls);
the next refresh, on the kernel's main thread, asks the run without waiting (an asker returns
a future) and a later refresh shows the answer in a block of fixed height under the plot, so
nothing below it moves. :class:`AskButtonPanel` is that shape; the Stacks and Profile panels
say what they ask and how they show it.

This package may not import the launch's (which imports it), so the launch hands its ways of
asking the run in progress here when it is loaded (:func:`answer_asks`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from notebook_kit.live.panels import Panel

__all__ = ["BLOCK_PIXELS", "AskButtonPanel", "answer_asks", "asker"]

BLOCK_PIXELS = 270  # the block's height with its margins: the view grows by it, once
_BLOCK_STYLE = (
    f"height:{BLOCK_PIXELS - 10}px;overflow:auto;margin:4px 0;padding:4px 6px;"
    "border:1px solid #ddd;font-size:11px;line-height:14px;background:#fafafa"
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


class AskButtonPanel(Panel):
    """A button in the header whose click asks the run (:meth:`ask`, on the main thread) and
    a block under the plot, hidden until first shown, that shows the answer (:meth:`answered`)."""

    place = "header"
    button_text: ClassVar[str]
    icon: ClassVar[str]
    tooltip: ClassVar[str]
    block_style: ClassVar[str] = ""  # added to the block's style

    def __init__(self) -> None:
        self.button: Any = None
        self.block: Any = None
        self._view: Any = None
        self._clicks = self._seen = 0
        self._future: Any = None
        self._shown = ""

    def build(self, view: Any) -> list[tuple[str, Any]]:
        import ipywidgets as widgets  # with the notebook view only

        self.button = widgets.Button(
            description=self.button_text,
            icon=self.icon,
            tooltip=self.tooltip,
            layout=view.shared.layout,
            _dom_classes=(f"nk-{self.name}-button",),
        )
        self.button.on_click(self._clicked)
        # Hidden until first shown, then of fixed height: its own layout, never shrunk.
        layout = widgets.Layout(display="none", height=f"{BLOCK_PIXELS}px", flex="0 0 auto")
        self.block = view.shared.html("", (f"nk-{self.name}",), layout)
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
            self._future = self.ask()
        future = self._future
        if future is not None and future.done():
            self._future = None
            self.answered(future)

    def ask(self) -> Any:
        """Ask the run (showing that it asks); the future of the answer, None if it cannot."""
        raise NotImplementedError

    def answered(self, future: Any) -> None:
        """Show what ``future``, done, holds (or why there is nothing)."""
        raise NotImplementedError

    def show(self, inner_html: str) -> None:
        """Put ``inner_html`` in the block, showing the block the first time: the view's box,
        of fixed height, grows by the block's height once, so nothing else in it is squeezed."""
        if self.block is None or inner_html == self._shown:
            return
        self._shown = inner_html
        if self.block.layout.display == "none":
            box = getattr(self._view, "box", None)
            height = str(getattr(getattr(box, "layout", None), "height", "") or "")
            if height.endswith("px"):
                box.layout.height = f"{float(height[:-2]) + BLOCK_PIXELS:g}px"
            self.block.layout.display = None
        self.block.value = f'<div style="{_BLOCK_STYLE};{self.block_style}">{inner_html}</div>'
