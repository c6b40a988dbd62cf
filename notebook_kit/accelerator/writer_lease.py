"""One writer of a ``project_dir``'s numbered checkpoints at a time, through a lease file.

Two runs numbering checkpoints in one folder remove each other's saves (``total_limit``, the
cleanup of unfinished saves) and load each other's state. So the first numbered save of a
run takes ``project_dir/.checkpoint_writer.json`` (host, pid, since when, last renewed, a
token of its own), and every later save renews it. A second run is refused at its first
save with a :class:`~notebook_kit.accelerator.checkpoint_files.CheckpointError` naming the
holder.

A lease lapses, and the next run takes it over, when its writer is gone: its pid no longer
runs on this host; it was this process or one of its ancestors (a cell run again, the kernel
that launched this worker); the run is a restart of a launch (``max_restarts``: the same
run, maybe on other machines); or it was not renewed for :data:`LAPSE` seconds (a writer on
another machine that died). The end of a launched function gives its lease back.

Example::

    lease = WriterLease()
    lease.claim(Path("run"))  # raises CheckpointError while another run holds it
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from notebook_kit.accelerator.checkpoint_files import CheckpointError
from notebook_kit.accelerator.storage import StoragePath, bounded, refresh, write_whole
from notebook_kit.runtime.context import current_launch

__all__ = ["LAPSE", "LEASE", "WriterLease"]

LEASE = ".checkpoint_writer.json"
LAPSE = 30 * 60  # seconds without a save after which a lease is taken over


class WriterLease:
    """This run's claim on the numbered checkpoints of one folder (rank 0 holds it)."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self.since: float | None = None
        self._held: StoragePath | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy in another process is another writer."""
        return (WriterLease, ())

    def claim(self, root: StoragePath) -> None:
        """Take or renew the lease of ``root`` (a ``project_dir``).

        Raises:
            CheckpointError: Another live run holds it; the message names its host and pid.
        """
        holder = _read(root / LEASE)
        if holder and holder.get("token") != self.token and not _lapsed(holder):
            raise CheckpointError(
                f"save_state: another run is saving numbered checkpoints into {root}: pid "
                f"{holder.get('pid')} on {holder.get('host')}, since "
                f"{_when(holder.get('since'))} (last save {_when(holder.get('renewed'))}). "
                "Two runs in one project_dir remove and load each other's checkpoints. Give "
                "this run its own project_dir, or stop the other run; a run that died gives "
                f"up its claim after {LAPSE // 60} minutes (or remove {root / LEASE})."
            )
        now = time.time()
        if self.since is None or holder is None or holder.get("token") != self.token:
            self.since = now
        record = {"host": socket.gethostname(), "pid": os.getpid(), "since": self.since}
        record |= {"renewed": now, "token": self.token}
        write_whole(root / LEASE, json.dumps(record).encode())
        if self._held is None:
            self._held = root
            launch = current_launch()
            if launch is not None:  # the launch closes it when the function ends
                launch.extensions[f"{__name__}.{id(self)}"] = self

    def close(self) -> None:
        """Give the lease back (the end of a launched function); failures are left to
        the next run's takeover rules."""
        root, self._held, self.since = self._held, None, None
        if root is None:
            return
        with contextlib.suppress(Exception):
            bounded(root, lambda: _release(root, self.token), "giving back the lease")


def _release(root: StoragePath, token: str) -> None:
    holder = _read(root / LEASE)
    if holder and holder.get("token") == token:
        (root / LEASE).unlink()


def _read(path: StoragePath) -> dict[str, Any] | None:
    refresh(path.parent)
    try:
        holder = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:
        return None  # a damaged lease names no one: taken over
    return holder if isinstance(holder, dict) else None


def _lapsed(holder: dict[str, Any]) -> bool:
    """Whether the writer that holds ``holder`` is gone (see the module's rules)."""
    renewed = holder.get("renewed")
    if not isinstance(renewed, int | float) or time.time() - renewed > LAPSE:
        return True
    launch = current_launch()
    if launch is not None and launch.restart_count > 0:
        return True  # a restarted launch continues its own run
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    return pid in _this_process_and_its_ancestors() or not _running(pid)


def _this_process_and_its_ancestors() -> set[int]:
    """This pid and its parents' (Linux ``/proc``; elsewhere this pid and its parent's): a
    kernel that saved and then launched the workers hands its lease to them."""
    pids, pid = {os.getpid()}, os.getppid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        parent = [line.split()[1] for line in status.splitlines() if line.startswith("PPid:")]
        pid = int(parent[0]) if parent else 0
    return pids


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _when(stamp: Any) -> str:
    if not isinstance(stamp, int | float):
        return "an unknown time"
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
