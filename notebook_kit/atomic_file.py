"""Replace a file all at once: readers see the old content or the new, never half of it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["fsync_directory", "replace_atomically"]


def replace_atomically(
    path: Path, write: Callable[[IO[bytes]], None], durable: bool = False
) -> None:
    """Write a temporary file beside ``path`` with ``write``, then rename it over ``path``.

    ``durable`` also flushes the file and its directory to disk, so the new content survives
    a power cut once this returns.

    Example:
        >>> replace_atomically(Path("run.json"), lambda file: file.write(b"{}"))
    """
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        with open(temporary, "wb") as handle:
            write(handle)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, path)
        if durable:
            fsync_directory(path.parent)
    finally:
        temporary.unlink(missing_ok=True)


def fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
