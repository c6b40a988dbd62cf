"""The Stop button: a click sets the launch's stop flag; the run ends at a step boundary.

The click reaches a kernel busy with the launch cell through the view's route to a kernel
subshell (:func:`~notebook_kit.live.kernel_status.open_route`); where there is none, the button
says how to stop mid-run instead.
"""

from __future__ import annotations

import contextlib
from typing import Any

from notebook_kit.live.observer import LaunchInfo, LaunchSummary
from notebook_kit.live.panels import Panel
from notebook_kit.runtime.context import StopFlag

__all__ = ["StopPanel"]

_ASYNC_HINT = (
    "This kernel handles the click only after the cell ends; to stop mid-run, "
    "use `await notebook_launcher_async(...)`."
)


class StopPanel(Panel):
    """The Stop button in the view's header, its note (the hint) under it; "Stopping…" once
    the flag is seen. A click sets the launch's stop flag, and nothing once the run is over."""

    name = "stop"
    place = "header"

    def __init__(self) -> None:
        self.button: Any = None
        self.note: Any = None
        self.flag: StopFlag | None = None
        self._finished = False
        self._view: Any = None
        self._shown: set[str] = set()  # "stopping", "hint": each shown once

    def build(self, view: Any) -> list[tuple[str, Any]]:
        import ipywidgets as widgets  # with the notebook view only

        self._view, self._shown, self._finished = view, set(), False
        self.button = widgets.Button(
            description="Stop",
            icon="stop",
            button_style="warning",
            tooltip="Ends training at the next step boundary, on every rank",
            layout=view.shared.layout,
            _dom_classes=("nk-stop",),
        )
        self.button.on_click(self._clicked)
        # Shown only for the hint of an old kernel: a layout of its own.
        self.note = view.shared.html("", ("nk-stop-note",), widgets.Layout(display="none"))
        return [("header", self.button), ("body", self.note)]

    @property
    def controls(self) -> list[Any]:  # type: ignore[override]
        return [self.button] if self.button is not None else []

    def start(self, info: LaunchInfo) -> None:
        self.flag = info.stop_flag

    def _clicked(self, _: Any) -> None:
        # Runs on a subshell thread during the run: set the flag only, draw nothing.
        if not self._finished and self.flag is not None:
            with contextlib.suppress(ValueError):  # the flag's memory is gone after the run
                self.flag.set()

    def draw(self) -> None:
        if self.button is None or self.flag is None:
            return
        if self.flag.is_set() and "stopping" not in self._shown:
            self._shown.add("stopping")
            # Publishing from the main thread moves the route back to it: no more clicks needed.
            with self.button.hold_sync():
                self.button.description = "Stopping…"
                self.button.tooltip = "Training ends at the next step boundary, on every rank"
                self.button.disabled = True
        if self._view.routed is False and "hint" not in self._shown:
            self._shown.add("hint")
            # Clicks wait for the cell's end here: say how to stop mid-run.
            self.note.value = _ASYNC_HINT
            self.note.layout.display = None

    def finish(self, summary: LaunchSummary) -> None:
        self._finished = True  # clicks do nothing now (a route stays for the next launch)
