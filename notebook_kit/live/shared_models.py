"""Layout and style models that the widgets of one live view share.

Every ipywidgets widget is a model of its own in the front end, and so are its layout and its
style unless it is given existing ones: each opens a comm with a message (and closes it with
another) in every launch. Most of the view's widgets use the default layout and style, so one
of each serves them all; a widget whose layout changes during the run keeps its own. Classes
and fixed sizes are given when a widget is made, not set after it (one message each).
"""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
from ipywidgets.widgets.widget_string import HTMLStyle

__all__ = ["SharedModels"]


class SharedModels:
    """A default layout and an HTML style for the widgets of one view.

    Example:
        >>> shared = SharedModels()
        >>> first, second = shared.html("a"), shared.html("b", ("nk-note",))
        >>> first.layout is second.layout and first.style is second.style
        True
    """

    def __init__(self) -> None:
        self.layout = widgets.Layout()
        self.html_style = HTMLStyle()

    def html(
        self, value: str = "", classes: Sequence[str] = (), layout: widgets.Layout | None = None
    ) -> widgets.HTML:
        """An HTML widget with the shared style, and the shared layout unless given one."""
        return widgets.HTML(
            value,
            layout=self.layout if layout is None else layout,
            style=self.html_style,
            _dom_classes=tuple(classes),
        )
