"""A warm start for node processes: one process that has imported torch forks every node.

A node process started fresh pays for its interpreter and ``import torch``: about 3 s of CPU
on a 2-core machine, most of a warm cluster launch's time to its first step. An engine worker
(a Dask worker process, a Ray node's keeper actor) starts one zygote, once: a fresh interpreter
(``python -m notebook_kit.node.zygote``, never a fork of the engine worker, whose other threads
may hold locks) that imports torch and the node's modules, and then forks one child per node,
as a local launch forks its ranks from a kernel that has imported them already.

Each child is started over its own connection to the zygote's socket: the starter sends the
child's target, environment and file descriptors (its own stdout and stderr among them), reads
the child's pid, may send it signals, and reads its exit status once it has ended. The
connection is the child's lifeline: when the starter's end closes (the node task's process
died) the zygote kills the child, as ``PR_SET_PDEATHSIG`` kills a child of a task thread that
ended. The zygote ends with its owner's process (a pipe only the owner writes to closes) and
kills its children first. It ignores SIGINT and SIGTERM, which a process group or a SLURM step
sends to every process: they are for the node processes, which handle them.

The zygote runs on the node's machine, below the engine worker; :class:`Zygote` is its owner's
handle and :class:`ZygoteChild` the starter's, shaped as the ``subprocess.Popen`` it replaces.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from dataclasses import dataclass

from notebook_kit.runtime import codec

__all__ = ["PRELOAD", "Zygote", "ZygoteChild", "ZygoteError", "local_zygote"]

PRELOAD = ("torch", "torch.distributed", "notebook_kit.launch.node_process.process")
_INT = struct.Struct("!i")
_MAX_FDS = 16
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_NAME = b"nk-zygote"
_REQUEST_SECONDS = 10.0  # the zygote waits this long for a connected starter's request


@dataclass(frozen=True)
class ZygoteRequest:
    """What a starter asks of the zygote: call ``target`` in a new child, with ``env`` set."""

    target: str  # "module:function"
    env: dict[str, str]
    name: str = ""  # the child's process name


_REQUEST_KINDS = codec.kinds_of(ZygoteRequest)


class ZygoteError(RuntimeError):
    """The zygote could not start the child (it died, or refused the request)."""


class Zygote:
    """The owner's handle on one zygote: started at once, it imports while the owner goes on.

    ``env`` is the environment the zygote starts with, and so what the interpreter reads once
    at start-up (``MALLOC_*``, ``PYTHON*``) in every child; each child then sets its own
    ``os.environ`` from its request.

    Example::

        zygote = Zygote(env=dict(os.environ))
        child = ZygoteChild(zygote.path, "notebook_kit.launch.node_process.process:main",
                            fds=[orders_fd, events_fd], env=dict(os.environ))
        child.wait()
    """

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = PRELOAD) -> None:
        self._folder = tempfile.mkdtemp(prefix="notebook_kit-zygote-")
        self.path = os.path.join(self._folder, "socket")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(64)  # bound before the start: a starter may connect at once
        alive_read, self._alive = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "notebook_kit.node.zygote",
                 str(listener.fileno()), str(alive_read), ",".join(preload)],
                pass_fds=(listener.fileno(), alive_read),
                env=env,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            listener.close()
            os.close(alive_read)

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """End the zygote, and any child it still has; remove its socket."""
        with contextlib.suppress(OSError):
            os.close(self._alive)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self._folder)


class ZygoteChild:
    """One child of a zygote, as the starter sees it: the calls of ``subprocess.Popen`` that
    a node task makes (``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``).

    ``target`` (``"module:function"``) is called in the child with the numbers of ``fds`` as
    strings; its stdout and stderr are ``streams`` (the starter's own), ``name`` its process
    name (``/proc/PID/comm``: its command line is the zygote's). ``timeout`` bounds the wait
    for the child's pid, which includes the zygote's own start-up on its first child.
    """

    def __init__(
        self,
        path: str,
        target: str,
        fds: list[int],
        env: dict[str, str],
        name: str = "",
        streams: tuple[int, int] = (1, 2),
        timeout: float = 120.0,
    ) -> None:
        self.returncode: int | None = None
        self._lock = threading.Lock()
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._socket.connect(path)
            request = codec.encode(ZygoteRequest(target, env, name), _REQUEST_KINDS)
            socket.send_fds(self._socket, [_INT.pack(len(request))], [*streams, *fds])
            self._socket.sendall(request)
            self._socket.settimeout(timeout)
            pid = _read_int(self._socket)
        except (OSError, EOFError) as error:
            self._socket.close()
            raise ZygoteError(f"the zygote at {path} did not start the child: {error}") from error
        if pid < 0:
            self._socket.close()
            raise ZygoteError(f"the zygote at {path} could not fork (errno {-pid})")
        self.pid = pid
        self._socket.settimeout(None)

    def poll(self) -> int | None:
        with contextlib.suppress(BlockingIOError):  # a timeout of 0: the socket never blocks
            self.wait(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._lock:
            if self.returncode is None:
                self._socket.settimeout(timeout)
                try:
                    self._settle()
                except TimeoutError as error:
                    raise subprocess.TimeoutExpired(f"zygote child {self.pid}", timeout) from error
            assert self.returncode is not None
            return self.returncode

    def _settle(self) -> None:
        """Read the exit status (blocking as the socket is set); the zygote's death reads as
        a kill, as it killed the child when it died."""
        try:
            self.returncode = _read_int(self._socket)
        except (EOFError, ConnectionError):
            self.returncode = -signal.SIGKILL
        self._socket.close()

    def send_signal(self, signum: int) -> None:
        """Signal the child through the zygote, which never signals a child it has reaped."""
        if self.poll() is None:
            with contextlib.suppress(OSError):
                self._socket.send(bytes([int(signum)]))

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_local: Zygote | None = None
_local_lock = threading.Lock()


def local_zygote(env: dict[str, str]) -> Zygote:
    """This process's zygote, started with ``env`` by the first call (and again if it died).

    Kept for the life of this process: the next run's nodes start from it warm."""
    global _local
    with _local_lock:
        if _local is None or not _local.alive():
            if _local is not None:
                _local.close()
            _local = Zygote(env)
        return _local


def _read_int(sock: socket.socket) -> int:
    return _INT.unpack(_receive(sock, _INT.size, "zygote"))[0]


def _receive(sock: socket.socket, size: int, peer: str) -> bytes:
    """Exactly ``size`` bytes from ``sock``; EOFError if the ``peer`` closes it first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"the {peer} closed the connection")
        data += chunk
    return data


# -- the zygote process ----------------------------------------------------------------------


class _Server:
    """The zygote's loop: accept starters, fork children, pass on signals, report endings."""

    def __init__(self, listener: socket.socket, alive: int) -> None:
        self.listener, self.alive = listener, alive
        self.children: dict[int, socket.socket] = {}  # pid -> its starter's connection
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_write, False)
        os.set_blocking(self.wake_read, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.selector.register(alive, selectors.EVENT_READ, "alive")
        self.selector.register(self.wake_read, selectors.EVENT_READ, "reap")

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    self._accept()
                elif key.data == "alive":
                    self._end()
                    return
                elif key.data == "reap":
                    with contextlib.suppress(OSError):
                        os.read(self.wake_read, 4096)
                    self._reap()
                else:
                    self._heard(key.fileobj, key.data)  # type: ignore[arg-type]

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        fds: list[int] = []
        try:
            connection.settimeout(_REQUEST_SECONDS)
            header, fds, _, _ = socket.recv_fds(connection, _INT.size, _MAX_FDS)
            if len(header) != _INT.size or len(fds) < 2:
                raise EOFError("a short request")
            request = _receive(connection, _INT.unpack(header)[0], "starter")
            order = codec.decode(request, _REQUEST_KINDS, ZygoteRequest)
        except Exception:  # a starter that left or sent nonsense: the zygote serves on
            connection.close()
            for fd in fds:
                os.close(fd)
            return
        zygote = os.getpid()
        try:
            pid = os.fork()
        except OSError as error:
            with contextlib.suppress(OSError):
                connection.sendall(_INT.pack(-(error.errno or 1)))
            connection.close()
            for fd in fds:
                os.close(fd)
            return
        if pid == 0:
            self._become_child(connection, order, fds, zygote)
        for fd in fds:
            os.close(fd)
        self.children[pid] = connection
        connection.setblocking(False)
        with contextlib.suppress(OSError):
            connection.sendall(_INT.pack(pid))
        self.selector.register(connection, selectors.EVENT_READ, pid)
        self._reap()  # a child that ended before it was registered

    def _heard(self, connection: socket.socket, pid: int) -> None:
        """Signals from the starter; its end closed: it is gone, and so must the child be."""
        if connection.fileno() == -1:  # reaped earlier in the same select: its pid is reused
            return
        try:
            data = connection.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(connection)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return
        for signum in data:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            connection = self.children.pop(pid, None)
            if connection is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(connection)
            with contextlib.suppress(OSError):
                connection.setblocking(True)
                connection.sendall(_INT.pack(os.waitstatus_to_exitcode(status)))
            connection.close()

    def _end(self) -> None:
        """The owner is gone: so are the children."""
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def _become_child(
        self, connection: socket.socket, order: ZygoteRequest, fds: list[int], zygote: int
    ) -> None:
        """In the fork: die with the zygote, drop its state, take the request's streams and
        environment, and run the target; never returns."""
        code = 1
        try:
            _die_with(zygote)
            if order.name:
                _name(order.name.encode()[:15])
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.selector.close()
            for fd in (self.wake_read, self.wake_write, self.alive):
                os.close(fd)
            for other in (self.listener, connection, *self.children.values()):
                other.close()
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            os.close(fds[0])
            os.close(fds[1])
            _take_environment(order.env)
            module, _, function = order.target.partition(":")
            code = getattr(importlib.import_module(module), function)([str(fd) for fd in fds[2:]])
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code or 0)


def _take_environment(env: dict[str, str]) -> None:
    """The request's environment, and its ``PYTHONPATH`` folders first on ``sys.path``."""
    os.environ.clear()
    os.environ.update(env)
    folders = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [p for p in folders if p not in sys.path]


def _die_with(parent: int) -> None:
    """SIGKILL this process when ``parent`` (its zygote, single-threaded) ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # it ended before the request took effect
        os._exit(1)


def _name(name: bytes) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def main(argv: list[str]) -> int:
    """``python -m notebook_kit.node.zygote LISTENER_FD ALIVE_FD MODULE,MODULE...``"""
    listener = socket.socket(fileno=int(argv[0]))
    alive = int(argv[1])
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    # A thread that started this process may have blocked signals (a Ray worker blocks SIGINT
    # in its task thread): the mask is inherited, and SIGCHLD must reach the loop.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    _name(_NAME)
    for module in filter(None, argv[2].split(",")):
        try:
            importlib.import_module(module)
        except Exception:  # a child imports it again, and fails where it can report it
            traceback.print_exc()
    _Server(listener, alive).serve()
    with contextlib.suppress(OSError):  # its owner, gone, could not
        path = listener.getsockname()
        os.unlink(path)
        os.rmdir(os.path.dirname(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
