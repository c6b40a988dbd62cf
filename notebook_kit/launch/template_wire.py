"""What the kernel and its template process say to each other, and how it travels.

One request per fork: the kernel sends a :class:`ForkRequest` (the shipped call, the plan,
its environment) with the file descriptors the workers must share with it (the stop flag's
memory, the weights file); the template forks the guardian and answers a :class:`ForkReply`
with the kernel's ends of every pipe attached (``SCM_RIGHTS``), so the kernel's supervisor
reads them exactly as it reads a guardian it forked itself.

A frame is a 4-byte length, with the descriptors on it, then the message through the one codec
(:mod:`notebook_kit.runtime.codec`); the socket is a private pair between the kernel and the
process it started, so frames are not sealed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

from notebook_kit.runtime import codec
from notebook_kit.runtime.context import StopFlag

__all__ = ["ForkReply", "ForkRequest", "Ready", "SharedStopFlag", "receive", "send"]

_LENGTH = struct.Struct("!I")
MAX_FDS = 253  # the kernel's ends: two for the guardian, four per worker (SCM_MAX_FD is 253)


@dataclass(frozen=True)
class Ready:
    """The template has imported torch and the launch's modules: it serves forks now."""

    pid: int


@dataclass(frozen=True)
class ForkRequest:
    """Fork a guardian and its workers for ``payload`` (cloudpickled ``(call, models)``)."""

    payload: bytes
    plan: Any  # the LaunchPlan, pickled inside the frame
    restart_count: int
    env: dict[str, str]  # the kernel's environment now: the workers see what the user set
    path: tuple[str, ...]  # the kernel's sys.path: the user's modules import as there
    cwd: str
    has_weights: bool  # the second descriptor sent is the kernel's weights file
    argv: tuple[str, ...] = ()  # the kernel's sys.argv, which a forked worker would see


@dataclass(frozen=True)
class ForkReply:
    """The forked guardian, and each worker's rank and whether it has a pdb line.

    The descriptors follow: the guardian's control (write) and status (read) ends, then per
    worker stdout, stderr, messages (read) and, where ``answers`` says so, pdb's answers
    (write). ``model_ids`` are the shipped models' ids in the template, in the order sent.
    ``error`` says why nothing was forked (the call did not unpickle, a fork failed).
    """

    pid: int = 0
    ranks: tuple[int, ...] = ()
    answers: tuple[bool, ...] = ()
    model_ids: tuple[int, ...] = ()
    error: str | None = None


KINDS = codec.kinds_of(Ready, ForkRequest, ForkReply)


def send(sock: socket.socket, message: Any, fds: list[int] | tuple[int, ...] = ()) -> None:
    """One frame: its length with ``fds`` attached, then the encoded message."""
    data = codec.encode(message, KINDS)
    socket.send_fds(sock, [_LENGTH.pack(len(data))], list(fds))
    sock.sendall(data)


def receive(sock: socket.socket) -> tuple[Any, list[int]]:
    """The next frame's message and the descriptors that came with it.

    Raises:
        EOFError: the other side closed the socket (it ended).
    """
    header, fds, _, _ = socket.recv_fds(sock, _LENGTH.size, MAX_FDS)
    try:
        header += _exactly(sock, _LENGTH.size - len(header))
        data = _exactly(sock, _LENGTH.unpack(header)[0])
        return codec.decode(data, KINDS), fds
    except BaseException:
        for fd in fds:  # nobody else will: a frame cut short leaks none of its descriptors
            _close(fd)
        raise


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("the other side of the template's socket closed it")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class SharedStopFlag(StopFlag):
    """A stop flag whose two bytes live in a memory file, so a process the kernel did not fork
    (the template, and the workers it forks) maps the very same bytes: Stop, the launch's
    ending and a preemption read as with a forked launch's anonymous mapping.

    ``fd`` None makes a new one (the kernel); else the descriptor received (the template).
    """

    def __init__(self, fd: int | None = None) -> None:
        if fd is None:
            fd = os.memfd_create("notebook_kit-stop", os.MFD_CLOEXEC)
            os.ftruncate(fd, 2)
        self.fd = fd
        self._memory = mmap.mmap(fd, 2)

    def close(self) -> None:
        super().close()
        _close(self.fd)
