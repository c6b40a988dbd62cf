"""Keep the front end's kernel indicator on Busy for the whole launch.

Front ends take the kernel's state from the last ``status`` message it published, whatever
request it answers. During a launch other requests are served beside the busy cell (the Stop
button's route on a kernel subshell, its clicks, the comm subshell JupyterLab creates when the
first widget is shown), each ending with ``idle``: the indicator would say Idle mid-run, so the
keeper starts by publishing the cell's ``busy``. A thread listening to IOPub answered an
``idle`` with ``busy`` 5-10 ms late, and a client polling ``/api/kernels`` caught Idle in most
launches. So where the kernel publishes through ``Kernel._publish_status`` (ipykernel 6 and 7),
that method is wrapped on the kernel instance from the launch until the cell's own ``idle``:

- the ``idle`` of a request the launch sent itself (the route's, recognised by its client's
  session) is held back and published just before the cell's own ``idle``;
- any other ``idle`` (a click, a control moved: ipywidgets waits for it) is published at once,
  and the ``busy`` right behind it by the same thread, the next message on IOPub.

Elsewhere a thread subscribed to the kernel's status messages answers them, never the main one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

__all__ = ["BusyKeeper"]

_POLL_MS = 200  # a wait of the listening thread's poll; a stop request wakes it at once
_HANDSHAKE_SECONDS = 1.0  # wait at most this long for the subscription to be live


class BusyKeeper:
    """While running, answers any foreign ``idle`` of this kernel with the cell's ``busy``.

    Example::

        keeper = BusyKeeper.start()  # None outside an ipykernel
        keeper.hold_idles_of(route_session)  # the session of a client the launch itself uses
        ...  # the launch, with subshell traffic
        keeper.stop()
    """

    def __init__(self, kernel: Any, parent: dict[str, Any], socket: Any = None) -> None:
        self.kernel = kernel
        self.parent = parent
        self.socket = socket  # None when the kernel's own status publishing is wrapped
        self.answered = 0  # foreign idles answered or held back
        self._own = parent["header"].get("msg_id")
        self._held_sessions: set[str] = set()
        self._held: list[tuple[str, dict[str, Any]]] = []  # (channel, parent) of held idles
        self._lock = threading.Lock()
        self._seen_idle_of: set[str] = set()
        self._seen = threading.Condition()
        self._stopping = threading.Event()
        # A stop and an answer are exclusive: no ``busy`` goes out on the cell's behalf once
        # ``stop`` has returned. The listening thread's ``stop`` writes to a pipe it polls, so
        # the launch's end never waits out a poll interval.
        self._publishing = threading.Lock()
        self._wake: tuple[int, int] | None = None
        self._thread = threading.Thread(target=self._run, name="notebook_kit-busy", daemon=True)

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
        if callable(getattr(type(kernel), "_publish_status", None)):
            keeper = cls(kernel, parent)
            keeper._wrap_publishing()
            keeper._publish_busy()  # an idle published before the keeper started is undone
            return keeper
        return cls._start_listening(kernel, parent)

    def hold_idles_of(self, session: str) -> None:
        """Requests of client ``session`` are the launch's own: hold their ``idle`` back."""
        if self.socket is None:
            self._held_sessions.add(session)

    # -- the wrapped publishing ----------------------------------------------------------

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
                self._note_idle_of(request, answered=True)
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

    # -- the listening thread, where the kernel has no ``_publish_status`` ----------------

    @classmethod
    def _start_listening(cls, kernel: Any, parent: dict[str, Any]) -> BusyKeeper | None:
        try:
            import zmq
            from ipykernel.connect import get_connection_info

            info: Any = get_connection_info(unpack=True)
            if info.get("transport", "tcp") != "tcp":
                return None
            socket = zmq.Context.instance().socket(zmq.SUB)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SUBSCRIBE, f"kernel.{kernel.ident}.status".encode())
            socket.connect(f"tcp://{info['ip']}:{info['iopub_port']}")
        except Exception:
            return None
        keeper = cls(kernel, parent, socket)
        keeper._wake = os.pipe()
        keeper._handshake()
        keeper._thread.start()
        return keeper

    def _handshake(self) -> None:
        """Publish the cell's ``busy`` until it comes back: from then on nothing is missed."""
        import zmq

        deadline = time.monotonic() + _HANDSHAKE_SECONDS
        while time.monotonic() < deadline:
            self._publish_busy()
            if self.socket.poll(20, zmq.POLLIN):
                with contextlib.suppress(Exception):
                    while self.socket.poll(0, zmq.POLLIN):
                        self.socket.recv_multipart()
                return

    def _run(self) -> None:
        import zmq

        assert self._wake is not None
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self._wake[0], zmq.POLLIN)
        while not self._stopping.is_set():
            try:
                if self.socket not in dict(poller.poll(_POLL_MS)):
                    continue
                parts = self.socket.recv_multipart()
                _, body = self.kernel.session.feed_identities(parts)
                message = self.kernel.session.deserialize(body)
            except Exception:
                continue
            if message["content"].get("execution_state") == "idle":
                self._answer(message["parent_header"].get("msg_id"))

    # -- both ------------------------------------------------------------------------------

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
            answered = request != self._own and not self._stopping.is_set()
            if answered:
                self._publish_busy()
        self._note_idle_of(request, answered)

    def _note_idle_of(self, request: str | None, answered: bool) -> None:
        self.answered += answered
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
        if self.socket is None or self._wake is None:
            return
        os.write(self._wake[1], b"x")
        self._thread.join(timeout=2 * _POLL_MS / 1000)
        with contextlib.suppress(Exception):
            self.socket.close(linger=0)
        for fd in self._wake:
            os.close(fd)
