"""Reads the records of an offline W&B run (``run-<id>.wandb``) without uploading anything.

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic, version) and then
LevelDB-style log blocks of 32 KiB, each record a 7-byte header (CRC-32, length, type: full,
first, middle, last) and its payload, a protobuf ``Record``. wandb no longer ships a Python
reader, so the tests read it here.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> Iterator[bytes]:
    assert data[:4] == b":W&B", "not a W&B run file"
    at, pending = _HEADER, b""
    while at + _HEADER <= len(data):
        left = _BLOCK - at % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            at += left
            continue
        _, length, kind = struct.unpack("<IHB", data[at : at + _HEADER])
        if length == 0 and kind == 0:
            at += left
            continue
        body = data[at + _HEADER : at + _HEADER + length]
        at += _HEADER + length
        if kind == _FULL:
            yield body
        elif kind == _FIRST:
            pending = body
        elif kind == _MIDDLE:
            pending += body
        elif kind == _LAST:
            yield pending + body
            pending = b""


def records(path: Path) -> list[Any]:
    """Every ``wandb_internal_pb2.Record`` in the run file, in order."""
    from wandb.proto import wandb_internal_pb2

    found = []
    for payload in _payloads(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        found.append(record)
    return found
