"""Where checkpoints live: a local folder, or any fsspec URL (``s3://``, ``gs://``, ``az://``).

:func:`storage_path` turns what the user gave into a path object the checkpoint code uses as it
uses a :class:`~pathlib.Path`: a local path (or ``file://`` URL) stays a ``Path``, anything
else becomes a ``UPath`` of ``universal_pathlib`` over fsspec, with ``storage_options``. The few
operations whose meaning differs between a disk and an object store are here:

- a file that must be whole before anything names it (:func:`write_durably`, the manifest's
  :func:`write_whole`): fsync and an atomic rename on a disk; one object write on an object
  store, which is whole or absent by itself;
- removing a folder (:func:`remove_tree`), free space (:func:`free_space`), fresh listings
  (:func:`refresh`: another process may have written since this one last listed);
- the reader and writer of torch's sharded checkpoints (:func:`dcp_reader`, :func:`dcp_options`).

Credentials come from where the backend looks (environment, its config files) or from
``storage_options``; a URL that carries a password is refused, so none ever reaches a message.
After a failure, :func:`fresh` drops fsspec's shared filesystem objects, so the next save
reads credentials anew (set in the kernel since, perhaps).

Storage that stops answering fails a save in bounded time: an S3 client waits at most
``storage_timeout`` seconds for an answer, retries included (:func:`storage_timeout`), and
:func:`bounded` gives up on any backend's call that stays silent that long.

Example::

    path = storage_path("s3://bucket/run-1", {"anon": False})
    (path / "checkpoints").exists()
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from notebook_kit.atomic_file import replace_atomically
from notebook_kit.config.schema import SETTINGS, parse_text
from notebook_kit.runtime.context import current_launch

__all__ = [
    "MissingRoot",
    "StoragePath",
    "StorageSilent",
    "bounded",
    "check_root",
    "dcp_options",
    "dcp_reader",
    "free_space",
    "fresh",
    "is_local",
    "make_folder",
    "refresh",
    "remove_tree",
    "storage_path",
    "storage_timeout",
    "write_durably",
    "write_whole",
]

StoragePath = Any  # a pathlib.Path, or a upath.UPath for a URL
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

# The fsspec backend package of each common protocol, and the extra that installs it.
_BACKENDS = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
}


def storage_path(
    location: str | os.PathLike[str] | Any,
    storage_options: Mapping[str, Any] | None = None,
    *,
    name: str = "output_dir",
) -> StoragePath:
    """``location`` as a path object: a ``Path`` on this machine, a ``UPath`` for a URL.

    ``name`` is the parameter the errors name.

    Raises:
        ImportError: The URL's fsspec backend is not installed (the message names the extra).
        ValueError: The URL carries a password, or ``storage_options`` are given for a local path.
    """
    if _is_upath(location):
        return location
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError(
            f"storage_options must be a dict of the fsspec backend's options, got "
            f"{type(storage_options).__name__}."
        )
    text = os.fspath(location) if isinstance(location, os.PathLike) else location
    if not isinstance(text, str) or not _URL.match(text):
        if storage_options:
            raise ValueError(
                f"storage_options= is for a URL ({name}='s3://bucket/...'); {name}={text!r} "
                "is a local path, where they mean nothing. Drop them, or give a URL."
            )
        return Path(text)
    parts = urlsplit(text)
    if parts.password:
        raise ValueError(
            f"{name} carries a password in its URL; put credentials in storage_options= or "
            "where the storage's own tools look (environment variables, config files), so "
            "that they never appear in a checkpoint, a log or an error message."
        )
    if parts.scheme == "file":
        if storage_options:
            raise ValueError(f"storage_options= mean nothing for the file:// URL {name}.")
        return Path(parts.path)
    return _upath(text, parts.scheme, dict(storage_options or {}), name)


def _upath(url: str, protocol: str, options: dict[str, Any], name: str) -> StoragePath:
    package, extra = _BACKENDS.get(protocol, (None, "storage"))
    try:
        import fsspec
        from upath import UPath
    except ImportError as error:
        raise ImportError(
            f"{name}={url!r} is a URL: checkpoints on remote storage need fsspec and "
            f"universal_pathlib: pip install 'notebook_kit[{extra}]'."
        ) from error
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as error:
        needs = package or f"the fsspec backend for {protocol}://"
        raise ImportError(
            f"{name}={url!r} needs {needs}, which is not installed: pip install "
            f"'notebook_kit[{extra}]'{'' if package else f' and {needs}'}."
        ) from error
    except ValueError as error:
        raise ValueError(
            f"{name}={url!r}: fsspec knows no storage called {protocol!r}. Give a local path "
            "or a URL such as s3://bucket/folder, gs://bucket/folder or az://container/folder."
        ) from error
    return UPath(url, **_client_options(protocol, options))


def _client_options(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with, for S3, requests that give up.

    s3fs tries each call ``retries`` times, each with botocore's connect and read timeouts;
    botocore's own retries are turned off, so one call waits at most about the bound.
    """
    own = dict(options)
    if protocol in ("s3", "s3a"):
        from s3fs import S3FileSystem

        seconds = storage_timeout() / max(1, S3FileSystem.retries)
        config = {"connect_timeout": seconds, "read_timeout": seconds}
        config["retries"] = {"total_max_attempts": 1}
        own["config_kwargs"] = config | dict(options.get("config_kwargs") or {})
    return own


def fresh(path: StoragePath | None) -> StoragePath | None:
    """``path`` on a new filesystem object, after fsspec forgot the ones it shares: the next
    use of any URL reads credentials and options again. For after a failure only: a new
    client costs a few hundred milliseconds."""
    for protocol in _BACKENDS:
        with contextlib.suppress(ImportError, ValueError):
            import fsspec

            fsspec.get_filesystem_class(protocol).clear_instance_cache()
    if path is None or is_local(path):
        return path
    return type(path)(str(path), **dict(path.storage_options))


def storage_timeout() -> int:
    """Seconds a save waits for storage that does not answer: the launch's
    ``storage_timeout``, else ``NOTEBOOK_KIT_STORAGE_TIMEOUT``, else the default (60).

    Raises:
        ValueError: The variable holds no whole number of seconds from 1 to 3600.
    """
    launch = current_launch()
    if launch is not None and launch.storage_timeout is not None:
        return launch.storage_timeout
    setting = SETTINGS["storage_timeout"]
    text = os.environ.get(setting.env_var)
    if text is None:
        return int(setting.default)
    try:
        return int(parse_text(setting.name, text))
    except (TypeError, ValueError) as error:
        raise ValueError(f"${setting.env_var}={text!r}: {error}") from error


class MissingRoot(FileNotFoundError):
    """The bucket or container of a URL does not exist."""


class StorageSilent(TimeoutError):
    """Storage gave no answer within ``storage_timeout`` seconds."""


class _Progress:
    """When the storage last answered: the writes of a bounded call mark it as they return."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def mark(self) -> None:
        self.last = time.monotonic()


_active = threading.local()  # the _Progress of the bounded call this thread runs


def bounded(path: StoragePath, call: Callable[[], Any], what: str) -> Any:
    """``call()``'s value, or :class:`StorageSilent` once the storage of ``path`` has been
    silent for ``storage_timeout`` seconds: since the call began, or since the last piece
    :func:`write_durably` wrote in it. On a local disk ``call`` simply runs.

    A silent call is left running on its daemon thread: a socket that never answers cannot
    be interrupted from outside; what it may still write is removed by the next save.
    """
    if is_local(path):
        return call()
    progress, limit = _Progress(), storage_timeout()
    outcome: dict[str, Any] = {}

    def run() -> None:
        _active.progress = progress
        try:
            outcome["value"] = call()
        except BaseException as error:  # handed to the waiting thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name=f"storage: {what}", daemon=True)
    thread.start()
    while True:
        thread.join(max(0.0, progress.last + limit - time.monotonic()))
        if not thread.is_alive():
            break
        if time.monotonic() - progress.last >= limit:
            raise StorageSilent(f"{path} gave no answer for {limit} s while {what}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def check_root(path: StoragePath) -> None:
    """Refuse a URL whose bucket or container does not exist: a save never creates one.

    Raises:
        MissingRoot: No such bucket or container (the caller names the save).
    """
    if is_local(path):
        return
    root = path.fs._strip_protocol(path.path).split("/", 1)[0]
    found = _roots_found.setdefault(path.fs, set())
    if root in found:  # asked once per filesystem: a bucket's listing can take a second
        return
    try:
        path.fs.info(root)  # unlike exists(), lets missing credentials or a timeout through
    except FileNotFoundError:
        raise MissingRoot(
            f"the bucket (or container) {root!r} does not exist, and a save never creates "
            "one. Create it with your storage's console or command-line tool, or correct the "
            "name."
        ) from None
    found.add(root)


_roots_found: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def make_folder(path: StoragePath) -> None:
    """Create the folder ``path`` where folders exist; on an object store a prefix needs
    none, and its ``mkdir`` would create a missing bucket."""
    if is_local(path) or path.protocol not in _BACKENDS:
        path.mkdir(parents=True, exist_ok=True)


def _is_upath(value: Any) -> bool:
    return type(value).__module__.startswith("upath.")


def is_local(path: StoragePath) -> bool:
    """Whether ``path`` is on this machine's file system (a disk, NFS, Lustre ...)."""
    return isinstance(path, Path)


def write_durably(path: StoragePath, write: Callable[[IO[bytes]], Any]) -> None:
    """Write a file that is complete when this returns (a later commit names it); in a
    :func:`bounded` call, each piece the storage takes counts as an answer."""
    progress = getattr(_active, "progress", None)
    with path.open("wb") as handle:
        if is_local(path) or progress is None:
            write(handle)
        else:
            write(_Marking(handle, progress))
        if is_local(path):
            handle.flush()
            os.fsync(handle.fileno())


class _Marking:
    """A file handle whose writes mark progress, a piece at a time: one large write
    uploads many blocks, and each block is an answer from the storage."""

    _PIECE = 8 << 20

    def __init__(self, handle: IO[bytes], progress: _Progress) -> None:
        self._handle, self._progress = handle, progress

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), self._PIECE):
            self._handle.write(view[start : start + self._PIECE])
            self._progress.mark()
        return len(view)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def write_whole(path: StoragePath, data: bytes) -> None:
    """Write ``data`` so that a reader finds the old file or the new one, never a part."""
    if is_local(path):
        replace_atomically(path, lambda handle: handle.write(data), durable=True)
    else:
        path.write_bytes(data)  # one object write: whole or absent


def remove_tree(path: StoragePath) -> None:
    """Remove a folder and what it holds; nothing happens when it is not there."""
    if is_local(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(FileNotFoundError):
        path.fs.rm(path.path, recursive=True)


def refresh(path: StoragePath) -> None:
    """Forget cached listings: what other processes wrote since becomes visible."""
    if not is_local(path):
        path.fs.invalidate_cache()


def free_space(path: StoragePath) -> int | None:
    """Bytes free to this user where ``path`` is, or None on an object store."""
    if not is_local(path):
        return None
    while not path.exists() and path.parent != path:
        path = path.parent
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def dcp_reader(path: StoragePath) -> Any:
    """torch's reader of the sharded (DCP) checkpoint at ``path``."""
    if is_local(path):
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(path)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(str(path), **dict(path.storage_options))


def dcp_options(path: StoragePath, writing: bool) -> dict[str, Any]:
    """Keyword arguments for ``torch.distributed.checkpoint.save``/``load`` at ``path``."""
    if is_local(path):
        return {"checkpoint_id": path}
    if not writing:
        return {"storage_reader": dcp_reader(path)}
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return {"storage_writer": FsspecWriter(str(path), **dict(path.storage_options))}
