"""The Stop button, and how its click reaches a kernel that is busy running the launch cell.

The blocking ``notebook_launcher`` keeps the kernel's main shell busy, so a widget event queued
behind it would run after the training. ipykernel 7's kernel subshells (JEP 91) are extra shell
threads, made with a ``create_subshell_request`` on the control channel, that serve messages
meanwhile; ipykernel sends a comm's messages to the subshell that last published on it. So once
a run has lasted ``notebook_view.ROUTE_AFTER``, the kernel connects a client to itself through
its connection file, creates a subshell and opens a comm on it whose handler republishes the
button's state (and the plot's controls'): from then on their events are handled on that idle
subshell, with any front end. The client and its subshell are kept for the kernel's later
launches. The click handler only sets the stop flag; the ``idle`` of these requests is held
back by :class:`~notebook_kit.live.kernel_status.BusyKeeper`, so the kernel still shows Busy.

Where that is not possible (ipykernel 6, no connection file) the click is still served while a
cell awaits ``notebook_launcher_async``, and the button says so.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from notebook_kit.live.shared_models import SharedModels
from notebook_kit.runtime.context import StopFlag

__all__ = ["StopButton"]

_REPLY_TIMEOUT = 2.0  # seconds to wait for the kernel's control thread and the subshell
_ASYNC_HINT = (
    "This kernel handles the click only after the cell ends; to stop mid-run, "
    "use `await notebook_launcher_async(...)`."
)


class StopButton:
    """A Stop button that sets a launch's stop flag, served while the cell runs.

    Example::

        button = StopButton(info.stop_flag); display(button.button)
        ...  # the run
        button.finish()
    """

    def __init__(self, stop_flag: StopFlag, shared: SharedModels | None = None) -> None:
        shared = shared if shared is not None else SharedModels()
        self._flag = stop_flag
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
        self._route: _SubshellRoute | None = None

    def _clicked(self, _: Any) -> None:
        # Runs on a subshell thread during the run: set the flag only, draw nothing.
        if not self._finished:
            with contextlib.suppress(ValueError):  # the flag's memory is gone after the run
                self._flag.set()

    def serve_during_run(
        self, *others: widgets.Widget, hold_idles: Callable[[str], None] | None = None
    ) -> bool:
        """Route clicks (and ``others``' events) to a kernel subshell; False (and a hint)
        where that is impossible. ``hold_idles`` is told the session of the route's own
        requests, whose ``idle`` must not show while the cell runs."""
        self._route = _SubshellRoute.open(hold_idles)
        if self._route is not None and self._route.republish(self.button, *others):
            return True
        if self._route is not None:  # it did not answer: the next launch makes a new one
            self._route.forget()
            self._route = None
        self.note.value = _ASYNC_HINT
        self.note.layout.display = None
        return False

    def show_stopping(self) -> None:
        """Called from the main thread once the flag is seen: the button says so, greyed."""
        # Publishing from the main thread moves the route back to it: no more clicks needed.
        with self.button.hold_sync():
            self.button.description = "Stopping…"
            self.button.tooltip = "Training ends at the next step boundary, on every rank"
            self.button.disabled = True

    def finish(self) -> str | None:
        """The run is over: clicks do nothing; the route stays for the next launch.

        Returns:
            The id of the route's last request (its ``idle`` is held back), or None.
        """
        self._finished = True
        route, self._route = self._route, None
        return route.last_request if route is not None else None


class _SubshellRoute:
    """A client of this kernel holding one subshell, used to claim comms for that subshell.

    One is kept per kernel process (:data:`_KEPT`) and used by every launch after the first.
    """

    def __init__(self, client: Any, subshell_id: str) -> None:
        self.client = client
        self.subshell_id = subshell_id
        self.last_request: str | None = None

    @classmethod
    def open(cls, hold_idles: Callable[[str], None] | None = None) -> _SubshellRoute | None:
        """The kept route (its requests' idles told to ``hold_idles``), or a new one."""
        global _KEPT
        route = _KEPT
        if route is not None:
            if hold_idles is not None:
                hold_idles(route.client.session.session)
            route.last_request = None
            return route
        _KEPT = route = cls._create(hold_idles)
        return route

    @classmethod
    def _create(cls, hold_idles: Callable[[str], None] | None) -> _SubshellRoute | None:
        client = _self_client()
        if client is None:
            return None
        if hold_idles is not None:
            hold_idles(client.session.session)
        try:
            reply, _ = _control_request(client, "create_subshell_request", {})
        except Exception:
            reply = None
        except BaseException:  # Ctrl-C while it opens (it opens during the run): leave no client
            client.stop_channels()
            raise
        if not reply or reply.get("status") != "ok" or not reply.get("subshell_id"):
            client.stop_channels()
            return None
        return cls(client, reply["subshell_id"])

    def republish(self, *claimed: widgets.Widget) -> bool:
        """Publish the widgets' state from the subshell, so their events are handled there."""
        import comm

        done = threading.Event()
        target = f"notebook_kit.route.{uuid.uuid4().hex}"

        def claim(opened: Any, _: dict[str, Any]) -> None:
            try:
                for widget in claimed:
                    widget.send_state()
            finally:
                done.set()
                opened.close()

        manager = comm.get_comm_manager()
        manager.register_target(target, claim)
        try:
            message = self.client.session.msg(
                "comm_open", {"comm_id": uuid.uuid4().hex, "target_name": target, "data": {}}
            )
            message["header"]["subshell_id"] = self.subshell_id
            self.client.shell_channel.send(message)
            self.last_request = message["header"]["msg_id"]
            return done.wait(_REPLY_TIMEOUT)
        finally:
            manager.unregister_target(target, claim)

    def forget(self) -> None:
        """Stop keeping this route (it did not answer) and delete its subshell."""
        global _KEPT
        if _KEPT is self:
            _KEPT = None
        with contextlib.suppress(Exception):
            _control_request(
                self.client, "delete_subshell_request", {"subshell_id": self.subshell_id}
            )
        with contextlib.suppress(Exception):
            self.client.stop_channels()


_KEPT: _SubshellRoute | None = None  # this kernel's route, made by its first launch that needs one


def _self_client() -> Any:
    """A jupyter_client connected to this very kernel, or None outside an ipykernel >= 7."""
    try:
        import ipykernel
        from ipykernel.connect import get_connection_file
        from jupyter_client import BlockingKernelClient

        if int(ipykernel.__version__.split(".")[0]) < 7:  # no subshells before ipykernel 7
            return None
        client = BlockingKernelClient(connection_file=get_connection_file())
        client.load_connection_file()
        client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=True)
    except Exception:  # not in a kernel started from a connection file
        return None
    return client


def _control_request(
    client: Any, msg_type: str, content: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """Send a control request; its reply's content and the request's id."""
    message = client.session.msg(msg_type, content)
    client.control_channel.send(message)
    msg_id = message["header"]["msg_id"]
    while True:  # replies to other requests of this private client cannot arrive, but check
        reply = client.control_channel.get_msg(timeout=_REPLY_TIMEOUT)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], msg_id
