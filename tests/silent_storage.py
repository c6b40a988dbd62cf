"""Storage that stops answering, for the tests: a loopback port that accepts connections and
never answers (a partition, a hung proxy), and a relay to a real server that can be made to
fall silent at any moment."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit


@contextlib.contextmanager
def silent_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:<port>``: the kernel completes every connection (the backlog holds
    them) and nothing ever reads or answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(512)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


class Relay:
    """Forwards connections to ``target`` until :meth:`fall_silent`; from then on it takes
    what clients send and answers nothing, on new connections and open ones alike."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self._target = (parts.hostname, parts.port)
        self._silent = threading.Event()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def fall_silent(self) -> None:
        self._silent.set()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target)
            except OSError:  # the server is gone (the module's end): as if it never answered
                client.close()
                continue
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if not self._silent.is_set():
                    sink.sendall(data)  # silent: what came is swallowed, nothing goes on
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
