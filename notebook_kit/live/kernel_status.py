"""Keep the front end's kernel indicator on Busy for the whole launch.

Jupyter front ends (JupyterLab's status bar, ``/api/kernels``, tools that wait for idle) take
the kernel's state from the last ``status`` message it published, whatever request it answers.
While a launch runs, other requests are served beside the busy cell: the Stop button's route
is set up on a kernel subshell and a control request, and a click is handled on that subshell.
Each of those ends with ``idle``, and the indicator would say Idle while the cell still runs.

So, during a launch, a thread listens to the kernel's own status messages (a SUB socket on its
IOPub port, subscribed to the status topic only: a few messages per launch) and answers every
``idle`` that is not the running cell's with ``busy`` on behalf of that cell. The main thread is
never involved, and the cell's own final ``idle`` comes after the launch, when nothing answers.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

__all__ = ["BusyKeeper"]

_POLL_MS = 200  # the thread checks for its stop request this often
_HANDSHAKE_SECONDS = 1.0  # wait at most this long for the subscription to be live


class BusyKeeper:
    """While running, answers any foreign ``idle`` of this kernel with the cell's ``busy``.

    Example:
        >>> keeper = BusyKeeper.start()  # None outside an ipykernel
        >>> ...  # the launch, with subshell traffic
        >>> keeper.stop()
    """

    def __init__(self, kernel: Any, parent: dict[str, Any], socket: Any) -> None:
        self.kernel = kernel
        self.parent = parent
        self.socket = socket
        self.answered = 0  # foreign idles answered: tests read it
        self._seen_idle_of: set[str] = set()
        self._seen = threading.Condition()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notebook_kit-busy", daemon=True)

    @classmethod
    def start(cls) -> BusyKeeper | None:
        """Start listening; None where there is no ipykernel with a connection file."""
        try:
            import zmq
            from ipykernel.connect import get_connection_info
            from ipykernel.kernelbase import Kernel

            if not Kernel.initialized():
                return None
            kernel = Kernel.instance()
            parent = kernel.get_parent("shell")
            info: Any = get_connection_info(unpack=True)
            if not parent.get("header") or info.get("transport", "tcp") != "tcp":
                return None
            socket = zmq.Context.instance().socket(zmq.SUB)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SUBSCRIBE, f"kernel.{kernel.ident}.status".encode())
            socket.connect(f"tcp://{info['ip']}:{info['iopub_port']}")
        except Exception:
            return None
        keeper = cls(kernel, parent, socket)
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

    def _publish_busy(self) -> None:
        self.kernel.session.send(
            self.kernel.iopub_socket,
            "status",
            {"execution_state": "busy"},
            parent=self.parent,
            ident=f"kernel.{self.kernel.ident}.status".encode(),
        )

    def _run(self) -> None:
        import zmq

        own = self.parent["header"].get("msg_id")
        while not self._stopping.is_set():
            try:
                if not self.socket.poll(_POLL_MS, zmq.POLLIN):
                    continue
                parts = self.socket.recv_multipart()
                _, body = self.kernel.session.feed_identities(parts)
                message = self.kernel.session.deserialize(body)
            except Exception:
                continue
            if message["content"].get("execution_state") != "idle":
                continue
            request = message["parent_header"].get("msg_id")
            if request != own:
                self._publish_busy()
                self.answered += 1
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
        self._stopping.set()
        self._thread.join(timeout=2 * _POLL_MS / 1000)
        with contextlib.suppress(Exception):
            self.socket.close(linger=0)
