"""The kernel's handle on a launch's guardian process (see :mod:`notebook_kit.worker.guardian`).

The guardian is the kernel's only child during a launch: it forks the workers, reports when
each starts and ends, and on ``request_stop`` stops them and everything they started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field

from notebook_kit.worker.guardian import RECORD, STOP

__all__ = ["GuardianLink", "Record"]

Record = tuple[int, int, int, float]  # rank, event, value, time.monotonic()


@dataclass
class GuardianLink:
    """Pipes to and from the guardian, and its pid."""

    pid: int
    control_fd: int  # write end: STOP; closing it (or the kernel dying) also stops the launch
    status_fd: int  # read end: one record per worker event
    closed: bool = False  # the status pipe reached its end: the guardian has swept
    released: bool = False  # reaped, pipes closed
    _buffer: bytes = field(default=b"", repr=False)

    def read_records(self) -> list[Record]:
        """Records waiting in the status pipe; sets ``closed`` once the guardian has exited."""
        records: list[Record] = []
        while not self.closed:
            try:
                data = os.read(self.status_fd, RECORD.size * 256)
            except BlockingIOError:
                break
            if not data:
                self.closed = True
                break
            self._buffer += data
        whole = len(self._buffer) - len(self._buffer) % RECORD.size
        records += [RECORD.unpack_from(self._buffer, i) for i in range(0, whole, RECORD.size)]
        self._buffer = self._buffer[whole:]
        return records

    def request_stop(self) -> None:
        """Ask the guardian to stop every worker (SIGTERM, grace, SIGKILL) and all below."""
        with contextlib.suppress(OSError):
            os.write(self.control_fd, STOP)

    def release(self, limit: float) -> bool:
        """Wait up to ``limit`` seconds for the guardian to exit, then reap it and close the
        pipes. False if it had to be killed (something below it could not be stopped)."""
        deadline = time.monotonic() + limit
        exited = True
        while self._alive():
            if time.monotonic() > deadline:
                exited = False
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self._reap()
                break
            time.sleep(0.002)
        for fd in (self.control_fd, self.status_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.closed = self.released = True
        return exited

    def _alive(self) -> bool:
        """False once the guardian has exited (reaped then: it is this process's child)."""
        return _running(self.pid)

    def _reap(self) -> None:
        """Collect the killed guardian's exit."""
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _running(pid: int) -> bool:
    """False once ``pid`` (a child) has exited; reaps it then."""
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False
