"""Whole lines from a worker's output pipe, in time linear in what was written.

A line longer than ``MAX_LINE_BYTES`` is cut into pieces of at most that size (at a UTF-8
character boundary) as it arrives, so one enormous line without a newline neither grows the
kernel's memory nor holds up everything else: each wake-up reads a bounded amount.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from notebook_kit.live.observer import Stream

__all__ = ["MAX_LINE_BYTES", "LineReader"]

# Longest piece of a line handed on at once; longer lines arrive as several.
MAX_LINE_BYTES = 16 * 1024
# Most bytes read from one pipe per wake-up of the wait loop, so other ranks are served too.
_READ_BUDGET = 1 << 20
_CHUNK = 1 << 16

Emit = Callable[[int, Stream, str], None]
# torch's profiler (kineto) writes a trace marker to the process's stderr at every start and
# stop, and an "ERROR" at its first start in a process forked after torch was imported (its
# thread check compares the kernel's thread with the rank's): notes to itself, never the rank's
# output, and the profile is whole. Not shown, wherever the profiler was started.
_PROFILER_NOTES = re.compile(
    rb"(?:USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\] "
    rb"|ERROR: External init callback must run in same thread as registerClient \("
)


@dataclass
class LineReader:
    """Reassembles whole lines from one worker's output pipe."""

    fd: int
    rank: int
    stream: Stream
    closed: bool = False
    _pending: bytearray = field(default_factory=bytearray, repr=False)

    def read(self, emit: Emit, budget: int | None = _READ_BUDGET) -> None:
        """Read what is available without blocking (up to ``budget`` bytes; None: all) and
        emit every complete line."""
        taken = 0
        while not self.closed and (budget is None or taken < budget):
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self.close(emit)
                return
            taken += len(chunk)
            self._feed(chunk, emit)

    def close(self, emit: Emit) -> None:
        """Emit what is left of an unfinished line and close the pipe."""
        if self.closed:
            return
        if self._pending:
            self._emit(bytes(self._pending), emit)
            self._pending.clear()
        self.closed = True
        os.close(self.fd)

    def _feed(self, chunk: bytes, emit: Emit) -> None:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if self._pending:
                self._pending += chunk[start:end]
                self._cut_long(emit)
                line = bytes(self._pending)
                self._pending.clear()
            else:
                line = chunk[start:end]
                while len(line) > MAX_LINE_BYTES:
                    cut = _boundary(line, MAX_LINE_BYTES)
                    self._emit(line[:cut], emit)
                    line = line[cut:]
            self._emit(line, emit)
            start = end + 1
        self._pending += chunk[start:]
        self._cut_long(emit)

    def _cut_long(self, emit: Emit) -> None:
        """Hand on full-size pieces of the unfinished line; what stays is under the limit."""
        while len(self._pending) > MAX_LINE_BYTES:
            cut = _boundary(self._pending, MAX_LINE_BYTES)
            self._emit(bytes(self._pending[:cut]), emit)
            del self._pending[:cut]

    def _emit(self, line: bytes, emit: Emit) -> None:
        if self.stream == "stderr" and _PROFILER_NOTES.match(line):
            return
        emit(self.rank, self.stream, line.decode("utf-8", "backslashreplace"))


def _boundary(data: bytes | bytearray, limit: int) -> int:
    """Where to cut ``data`` at most ``limit`` bytes in without splitting a UTF-8 character."""
    cut = limit
    # Step back over continuation bytes (0b10xxxxxx), at most three, to a character's start.
    while cut > limit - 3 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if (data[cut] & 0xC0) != 0x80 else limit
