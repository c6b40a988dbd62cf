"""The view's own traffic with its busy kernel: clicks served on a subshell, Busy kept on.

The blocking ``notebook_launcher`` keeps the kernel's main shell busy, so a widget event queued
behind it would run after the training. ipykernel 7's kernel subshells (JEP 91) are extra shell
threads, made with a ``create_subshell_request`` on the control channel, that serve messages
meanwhile; ipykernel sends a comm's messages to the subshell that last published on it. So once
a run has lasted ``notebook_view.ROUTE_AFTER``, the kernel connects a client to itself through
its connection file, creates a subshell and opens a comm on it whose handler republishes the
state of the view's controls (every panel's ``controls``: the Stop button, the plot's): from
then on their events are handled on that idle subshell, with any front end (:func:`open_route`).
The client and its subshell are kept for the kernel's later launches. A click handler only
notes the click. Where that is not possible (ipykernel 6, no connection file) a click is still
served while a cell awaits ``notebook_launcher_async``.

Front ends take the kernel's state from the last ``status`` message it published, whatever
request it answers. During a launch other requests are served beside the busy cell (the Stop
button's route on a kernel subshell, its clicks, the comm subshell JupyterLab creates when the
first widget is shown), each ending with ``idle``: the indicator would say Idle mid-run, so the
keeper starts by publishing the cell's ``busy``. A thread listening to IOPub answered an
``idle`` with ``busy`` 5-10 ms late, and a client polling ``/api/kernels`` caught Idle in most
launches. So the kernel's ``Kernel._publish_status`` (ipykernel 6 and 7, the versions the
package supports) is wrapped on the kernel instance from the launch until the cell's own
``idle``:

- the ``idle`` of a request the launch sent itself (the route's, recognised by its client's
  session) is held back and published just before the cell's own ``idle``;
- any other ``idle`` (a click, a control moved: ipywidgets waits for it) is published at once,
  and the ``busy`` right behind it by the same thread, the next message on IOPub.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

__all__ = ["BusyKeeper", "open_route"]


class BusyKeeper:
    """While running, answers any foreign ``idle`` of this kernel with the cell's ``busy``.

    Example::

        keeper = BusyKeeper.start()  # None outside an ipykernel
        keeper.hold_idles_of(route_session)  # the session of a client the launch itself uses
        ...  # the launch, with subshell traffic
        keeper.stop()
    """

    def __init__(self, kernel: Any, parent: dict[str, Any]) -> None:
        self.kernel = kernel
        self.parent = parent
        self._own = parent["header"].get("msg_id")
        self._held_sessions: set[str] = set()
        self._held: list[tuple[str, dict[str, Any]]] = []  # (channel, parent) of held idles
        self._lock = threading.Lock()
        self._seen_idle_of: set[str] = set()
        self._seen = threading.Condition()
        self._stopping = threading.Event()
        # A stop and an answer are exclusive: no ``busy`` goes out on the cell's behalf once
        # ``stop`` has returned.
        self._publishing = threading.Lock()

    @classmethod
    def start(cls) -> BusyKeeper | None:
        """Start answering; None where there is no ipykernel running a cell."""
        try:
            from ipykernel.kernelbase import Kernel

            if not Kernel.initialized():
                return None
            kernel = Kernel.instance()
            parent = kernel.get_parent("shell")
            if not parent.get("header"):
                return None
        except Exception:
            return None
        keeper = cls(kernel, parent)
        keeper._wrap_publishing()
        keeper._publish_busy()  # an idle published before the keeper started is undone
        return keeper

    def hold_idles_of(self, session: str) -> None:
        """Requests of client ``session`` are the launch's own: hold their ``idle`` back."""
        self._held_sessions.add(session)

    def _wrap_publishing(self) -> None:
        """Shadow the kernel's ``_publish_status`` until the cell's own ``idle``."""
        kernel = self.kernel
        original = kernel._publish_status
        before = kernel.__dict__.get("_publish_status")  # another launch's, in the same cell

        def publish(status: str, channel: str, parent: dict[str, Any] | None = None) -> None:
            parent = parent or kernel.get_parent(channel) or {}
            request = parent.get("header", {}).get("msg_id")
            if status != "idle":
                original(status, channel, parent)
            elif request == self._own:  # the cell ends: what was held back goes first
                self._release(original)
                if kernel.__dict__.get("_publish_status") is publish:
                    if before is None:
                        del kernel._publish_status
                    else:
                        kernel._publish_status = before
                original(status, channel, parent)
            elif parent.get("header", {}).get("session") in self._held_sessions:
                with self._lock:
                    self._held.append((channel, parent))
                self._note_idle_of(request)
            else:
                original(status, channel, parent)
                self._answer(request)

        kernel._publish_status = publish

    def _release(self, original: Any) -> None:
        """Publish the held ``idle`` messages, then ``busy``: the cell's ``idle`` follows."""
        with self._lock:
            held, self._held = self._held, []
        for channel, parent in held:
            original("idle", channel, parent)
        if held:
            self._publish_busy()

    def _publish_busy(self) -> None:
        self.kernel.session.send(
            self.kernel.iopub_socket,
            "status",
            {"execution_state": "busy"},
            parent=self.parent,
            ident=f"kernel.{self.kernel.ident}.status".encode(),
        )

    def _answer(self, request: str | None) -> None:
        """An ``idle`` of ``request`` went out: ``busy`` behind it, unless cell or launch ended."""
        with self._publishing:
            if request != self._own and not self._stopping.is_set():
                self._publish_busy()
        self._note_idle_of(request)

    def _note_idle_of(self, request: str | None) -> None:
        with self._seen:
            self._seen_idle_of.add(str(request))
            self._seen.notify_all()

    def wait_for_idle_of(self, msg_id: str | None, timeout: float = 0.5) -> bool:
        """Wait until the ``idle`` that ends request ``msg_id`` was seen (and answered)."""
        if msg_id is None:
            return True
        with self._seen:
            return self._seen.wait_for(lambda: msg_id in self._seen_idle_of, timeout)

    def stop(self) -> None:
        """The launch is over: answer no more. The wrapped publishing stays until the cell's
        ``idle``, which publishes what was held back before it."""
        with self._publishing:
            self._stopping.set()


_REPLY_TIMEOUT = 2.0  # seconds to wait for the kernel's control thread and the subshell


def open_route(
    claimed: tuple[Any, ...], hold_idles: Callable[[str], None] | None = None
) -> _SubshellRoute | None:
    """Route the events of the widgets ``claimed`` to a kernel subshell; None where that is
    impossible. ``hold_idles`` is told the session of the route's own requests, whose ``idle``
    must not show while the cell runs."""
    route = _SubshellRoute.open(hold_idles)
    if route is not None and route.republish(*claimed):
        return route
    if route is not None:  # it did not answer: the next launch makes a new one
        route.forget()
    return None


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

    def republish(self, *claimed: Any) -> bool:
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
