"""Edited modules reach a warm pool worker: the user's modules whose file changed are reloaded.

Before a cell, a call or a push that carries a :class:`~notebook_kit.runtime.pool_commands.
ReloadOrder`, a pool worker reloads, with IPython's ``%autoreload`` rules and limits, every
module it imported from the user's own files (not the standard library, not site-packages,
not notebook_kit) whose file's mtime is newer than when it was loaded: IPython's
``superreload`` clears the module, runs it again with ``importlib.reload``, and points the old
functions and classes at the new code, so objects made before (a model's instance) get the new
methods; names a cell bound with ``from m import f`` keep the old function object, whose code
is replaced too. What cannot change in place (a class's ``__slots__``, an Enum, a value copied
into another module) stays as autoreload leaves it.

On a cluster node the kernel ships the edited text (``shipped``); the rank reloads the module
from that text, whatever its own copy of the file says.

A module that no longer imports (a syntax error) is never half-loaded: every changed file is
compiled first, and a failure raises :class:`ModuleReloadError` naming the module, the file
and the line, before anything is reloaded or the command runs. Every rank sees the same files,
so every rank refuses the command alike, and keeps its old code until the file is fixed.

Runs in a pool worker.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import linecache
import os
import site
import sys
import sysconfig
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from notebook_kit.runtime.pool_commands import ReloadOrder

__all__ = ["ModuleReloadError", "PoolReloader", "is_user_file"]

_OWN_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ModuleReloadError(ImportError):
    """An edited module could not be reloaded; the pool keeps its old code."""


def _library_folders() -> tuple[str, ...]:
    """Where installed code lives: the standard library and every site-packages."""
    paths = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(site.getsitepackages())
    paths.add(site.getusersitepackages())
    paths.add(_OWN_PACKAGE)
    return tuple(os.path.realpath(path) + os.sep for path in paths if path)


_LIBRARIES = _library_folders()


@functools.cache  # checked before every command for every module: resolve each path once
def is_user_file(path: str) -> bool:
    """Whether ``path`` is one of the user's own Python files (what a pool reloads).

    Example:
        >>> import json
        >>> is_user_file(json.__file__), is_user_file("/home/me/project/model.py")
        (False, True)
    """
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return not real.startswith(_LIBRARIES)


def source_file(module: types.ModuleType) -> str | None:
    """The user's source file of ``module``, or None for a module a pool never reloads."""
    name = getattr(module, "__name__", None)
    filename = getattr(module, "__file__", None)
    if not isinstance(filename, str) or name in (None, "__main__", "__mp_main__"):
        return None
    if not filename.endswith(".py"):  # compiled bytecode only, or an extension: as autoreload
        try:
            filename = importlib.util.source_from_cache(filename)
        except ValueError:
            return None
    return filename if is_user_file(filename) else None


class PoolReloader:
    """The mtime of each user module at its last (re)load, and the reloading itself.

    Example::

        reloader = PoolReloader()        # at the worker's start: what it holds is current
        reloader.apply(ReloadOrder())    # before a command: reload what changed since
        reloader.note_new_modules()      # after it: the modules it imported are current
    """

    def __init__(self) -> None:
        self.mtimes: dict[str, float] = {}
        self.seen: set[str] = set()
        self.old_objects: dict[Any, list[Any]] = {}  # superreload's: old code to update
        self.note_new_modules()

    def note_new_modules(self) -> None:
        """Record the mtime of modules imported since the last call (autoreload's
        post-execute hook): an edit after this is what the next command reloads."""
        names = set(sys.modules)
        self.seen &= names  # one removed since, and imported again later, is new then
        for name in names - self.seen:
            mtime = _mtime(sys.modules.get(name))
            if mtime is not None:  # only the user's modules are watched: a few stats a command
                self.mtimes.setdefault(name, mtime)
        self.seen = names

    def apply(self, order: ReloadOrder) -> list[str]:
        """Reload the changed modules (``order.shipped`` from the kernel's text); their names.

        Raises:
            ModuleReloadError: a changed module does not compile, or raised as it ran again;
                nothing was reloaded in the first case, the others were in the second.
        """
        shipped = {item.module: item.source for item in order.shipped}
        changed = self._changed(shipped)
        sources = {name: _text(name, shipped) for name in changed}
        for name, source in sources.items():
            _compile(name, source)
        for name, source in sources.items():
            self._reload(name, source if name in shipped else None)
        return list(changed)

    def _changed(self, shipped: dict[str, str]) -> list[str]:
        changed = [name for name in shipped if source_file_of(name) is not None]
        self.note_new_modules()  # imported since the last command (a thread): as they are
        for name in list(sys.modules):  # in import order, as autoreload: dependencies first
            known = self.mtimes.get(name)
            if known is None or name in shipped:
                continue
            mtime = _mtime(sys.modules.get(name))
            if mtime is not None and mtime > known:
                changed.append(name)
        return changed

    def _reload(self, name: str, shipped: str | None) -> None:
        module = sys.modules[name]
        mtime = _mtime(module)
        try:
            with _serving(name, module, shipped):
                _superreload(module, self.old_objects)
        except Exception as error:
            raise ModuleReloadError(_why(name, module.__file__, error)) from None
        if mtime is not None:
            self.mtimes[name] = mtime


def source_file_of(name: str) -> str | None:
    """The user's source file of the loaded module ``name`` (None: not loaded, or not the
    user's)."""
    module = sys.modules.get(name)
    return source_file(module) if module is not None else None


def _mtime(module: types.ModuleType | None) -> float | None:
    filename = source_file(module) if module is not None else None
    if filename is None:
        return None
    try:
        return os.stat(filename).st_mtime
    except OSError:  # deleted or moved: nothing to reload from
        return None


def _text(name: str, shipped: dict[str, str]) -> str:
    if name in shipped:
        return shipped[name]
    filename = source_file_of(name)
    assert filename is not None
    with open(filename, "rb") as file:
        return importlib.util.decode_source(file.read())


def _compile(name: str, source: str) -> None:
    filename = source_file_of(name)
    try:
        compile(source, filename or name, "exec")
    except (SyntaxError, ValueError) as error:
        raise ModuleReloadError(_why(name, filename, error)) from None


def _why(name: str, filename: str | None, error: BaseException) -> str:
    line = getattr(error, "lineno", None)
    where = f"{filename}, line {line}" if line else str(filename)
    if not isinstance(error, SyntaxError):
        where = _raising_line(error) or where
    return (
        f"module {name!r} ({where}) was edited and no longer imports: "
        f"{type(error).__name__}: {error}. The workers keep its old code and this command "
        "did not run; fix the file and run it again (reload='off' runs on the old code)."
    )


def _raising_line(error: BaseException) -> str | None:
    """Where in the module's own file the error was raised, for an error at import time."""
    frames = list(_frames(error.__traceback__))
    for frame in reversed(frames):
        if is_user_file(frame.tb_frame.f_code.co_filename):
            return f"{frame.tb_frame.f_code.co_filename}, line {frame.tb_lineno}"
    return None


def _frames(tb: types.TracebackType | None) -> Iterator[types.TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


def _superreload(module: types.ModuleType, old_objects: dict[Any, list[Any]]) -> None:
    """IPython's ``superreload`` (old functions and classes take the new code), or a plain
    ``importlib.reload`` where IPython is not installed."""
    try:
        from IPython.extensions.autoreload import superreload
    except ImportError:
        importlib.reload(module)
        return
    superreload(module, importlib.reload, old_objects)


class _ShippedLoader(importlib.abc.SourceLoader):
    """Loads one module from the text the kernel shipped, under the rank's own file name."""

    def __init__(self, filename: str, source: str) -> None:
        self.filename, self.source = filename, source

    def get_filename(self, fullname: str) -> str:
        return self.filename

    def get_data(self, path: str) -> bytes:
        return self.source.encode()


class _ShippedFinder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, spec: importlib.machinery.ModuleSpec) -> None:
        self.name, self.spec = name, spec

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        return self.spec if fullname == self.name else None


@contextmanager
def _serving(name: str, module: types.ModuleType, shipped: str | None) -> Iterator[None]:
    """While reloading ``name``: the import system finds the shipped text first (if any)."""
    if shipped is None:
        yield
        return
    filename = source_file(module) or f"<shipped {name}>"
    old = getattr(module, "__spec__", None)
    locations = old.submodule_search_locations if old is not None else None
    loader = _ShippedLoader(filename, shipped)
    spec = importlib.util.spec_from_file_location(
        name, filename, loader=loader, submodule_search_locations=locations
    )
    assert spec is not None
    finder = _ShippedFinder(name, spec)
    sys.meta_path.insert(0, finder)
    # Tracebacks show the shipped lines, not the node's copy of the file.
    lines = shipped.splitlines(keepends=True)
    linecache.cache[filename] = (len(shipped), None, lines, filename)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
