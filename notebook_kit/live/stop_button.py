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

__all__ = ["StopButton", "StopPanel"]

_ASYNC_HINT = (
    "This kernel handles the click only after the cell ends; to stop mid-run, "
    "use `await notebook_launcher_async(...)`."
)


class StopButton:
    """A Stop button that sets a launch's stop flag (``flag``), and a note for the hint.

    Example::

        button = StopButton(info.stop_flag); display(button.button, button.note)
        ...  # the run (its clicks routed by the view: StopPanel)
        button.finish()
    """

    def __init__(self, stop_flag: StopFlag | None = None, shared: Any = None) -> None:
        import ipywidgets as widgets  # with the notebook view only

        from notebook_kit.live.shared_models import SharedModels

        shared = shared if shared is not None else SharedModels()
        self.flag = stop_flag
        self._finished = False
        self.button = widgets.Button(
            description="Stop",
            icon="stop",
            button_style="warning",
            tooltip="Ends training at the next step boundary, on every rank",
            layout=shared.layout,
            _dom_classes=("nk-stop",),
        )
        self.button.on_click(self._clicked)
        # Shown only for the hint of an old kernel: a layout of its own.
        self.note = shared.html("", ("nk-stop-note",), widgets.Layout(display="none"))

    def _clicked(self, _: Any) -> None:
        # Runs on a subshell thread during the run: set the flag only, draw nothing.
        if not self._finished and self.flag is not None:
            with contextlib.suppress(ValueError):  # the flag's memory is gone after the run
                self.flag.set()

    def show_hint(self) -> None:
        """Clicks wait for the cell's end here: say how to stop mid-run."""
        self.note.value = _ASYNC_HINT
        self.note.layout.display = None

    def show_stopping(self) -> None:
        """Called from the main thread once the flag is seen: the button says so, greyed."""
        # Publishing from the main thread moves the route back to it: no more clicks needed.
        with self.button.hold_sync():
            self.button.description = "Stopping…"
            self.button.tooltip = "Training ends at the next step boundary, on every rank"
            self.button.disabled = True

    def finish(self) -> None:
        """The run is over: clicks do nothing (a route stays for the next launch)."""
        self._finished = True


class StopPanel(Panel):
    """The Stop button in the view's header, its note (the hint) under it; "Stopping…" once
    the flag is seen."""

    name = "stop"
    place = "header"

    def __init__(self) -> None:
        self.stop: StopButton | None = None
        self.flag: StopFlag | None = None
        self._view: Any = None
        self._shown: set[str] = set()  # "stopping", "hint": each shown once

    def build(self, view: Any) -> list[tuple[str, Any]]:
        self.stop, self._view, self._shown = StopButton(self.flag, view.shared), view, set()
        return [("header", self.stop.button), ("body", self.stop.note)]

    @property
    def controls(self) -> list[Any]:  # type: ignore[override]
        return [self.stop.button] if self.stop is not None else []

    def start(self, info: LaunchInfo) -> None:
        self.flag = info.stop_flag
        if self.stop is not None:
            self.stop.flag = info.stop_flag

    def draw(self) -> None:
        if self.stop is None or self.flag is None:
            return
        if self.flag.is_set() and "stopping" not in self._shown:
            self._shown.add("stopping")
            self.stop.show_stopping()
        if self._view.routed is False and "hint" not in self._shown:
            self._shown.add("hint")
            self.stop.show_hint()

    def finish(self, summary: LaunchSummary) -> None:
        if self.stop is not None:
            self.stop.finish()
