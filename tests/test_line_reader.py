"""Worker output reassembled into lines: long lines cut into bounded pieces, nothing lost."""

from __future__ import annotations

import contextlib
import fcntl
import os

import pytest

from notebook_kit.launch.line_reader import MAX_LINE_BYTES, LineReader


@pytest.fixture
def pipe():
    read, write = os.pipe()
    os.set_blocking(read, False)
    yield read, write
    for fd in (read, write):
        with contextlib.suppress(OSError):
            os.close(fd)


def _collect(reader: LineReader, write: int, chunks: list[bytes], **read_options) -> list[str]:
    lines: list[str] = []

    def emit(rank, stream, line):
        lines.append(line)

    for chunk in chunks:
        os.write(write, chunk)
        reader.read(emit, **read_options)
    return lines


def test_whole_lines_are_emitted_once_complete(pipe):
    read, write = pipe
    reader = LineReader(read, 0, "stdout")
    lines = _collect(reader, write, [b"one\ntw", b"o\n", b"\nthree"])
    assert lines == ["one", "two", ""]
    os.close(write)
    reader.read(lambda rank, stream, line: lines.append(line))
    assert lines[-1] == "three" and reader.closed


def test_a_line_longer_than_the_limit_arrives_in_bounded_pieces(pipe):
    read, write = pipe
    reader = LineReader(read, 0, "stdout")
    text = b"x" * (5 * MAX_LINE_BYTES + 123)
    lines = _collect(reader, write, [text[i : i + 7000] for i in range(0, len(text), 7000)])
    lines += _collect(reader, write, [b"\nafter\n"])
    assert all(len(line) <= MAX_LINE_BYTES for line in lines)
    assert "".join(lines[:-1]) == text.decode() and lines[-1] == "after"
    assert len(lines) == 6 + 1  # five full pieces, the rest, then the next line


def test_a_long_line_is_cut_between_utf8_characters(pipe):
    read, write = pipe
    reader = LineReader(read, 0, "stdout")
    text = "é€😀" * MAX_LINE_BYTES  # 2-, 3- and 4-byte characters
    data = text.encode()
    lines = _collect(reader, write, [data[i : i + 4096] for i in range(0, len(data), 4096)])
    lines += _collect(reader, write, [b"\n"])
    assert "".join(lines) == text  # no character split into \\x escapes
    assert all(len(line.encode()) <= MAX_LINE_BYTES for line in lines)


def test_one_read_takes_a_bounded_amount(pipe):
    read, write = pipe
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 1 << 20)
    reader = LineReader(read, 0, "stdout")
    data = b"y" * (400 * 1024)
    os.write(write, data)
    lines: list[str] = []
    reader.read(lambda rank, stream, line: lines.append(line), budget=1)
    assert 0 < sum(map(len, lines)) <= 64 * 1024  # one chunk; the rest waits its turn
    reader.read(lambda rank, stream, line: lines.append(line), budget=None)
    os.close(write)
    reader.read(lambda rank, stream, line: lines.append(line))
    assert "".join(lines) == data.decode()


def test_the_profilers_notes_to_itself_on_stderr_are_not_a_ranks_output(pipe):
    read, write = pipe
    notes = (
        b"USDT:2026-12-06 12:25:35 13018:13018 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
        b"STAGE:2026-12-06 12:25:47 13092:13092 SyncActivityProfilerHandler.cpp:51] Completed\n"
        b"ERROR: External init callback must run in same thread as registerClient (-18 != -24)\n"
    )
    kept = b"ERROR: my own error\nUSDT: a line of mine\n"
    assert _collect(LineReader(read, 0, "stderr"), write, [notes + kept]) == [
        "ERROR: my own error",
        "USDT: a line of mine",
    ]
    assert len(_collect(LineReader(read, 0, "stdout"), write, [notes])) == 3  # printed: kept
