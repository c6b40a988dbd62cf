"""Run a function on a module as soon as it is imported, or at once if it already is.

A launched function usually imports ``transformers`` itself, after the launch became active;
an integration then has to act when that import happens. A finder placed first on
``sys.meta_path`` finds the module's spec through the other finders and wraps only that
spec's loader, so nothing else about the import changes.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["Undo", "when_imported"]

Undo = Callable[[], None]
Action = Callable[[ModuleType], "Undo | None"]


@contextlib.contextmanager
def when_imported(name: str, action: Action) -> Iterator[None]:
    """Within the block, call ``action(module)`` once ``name`` is imported; undo it after.

    ``action`` may return a function that reverses what it did; it is called when the block
    ends (so a run inside the kernel leaves the kernel's modules as they were).

    Example:
        >>> with when_imported("json", lambda module: print(module.__name__)):
        ...     import json
        json
    """
    undo: list[Undo] = []

    def run(module: ModuleType) -> None:
        reverse = action(module)
        if reverse is not None:
            undo.append(reverse)

    finder: _PostImportFinder | None = None
    module = sys.modules.get(name)
    if module is not None:
        run(module)
    else:
        finder = _PostImportFinder(name, run)
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder is not None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(finder)
        for reverse in reversed(undo):
            reverse()


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds one module through the other finders and runs ``on_load`` after it executes."""

    def __init__(self, name: str, on_load: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.on_load = on_load
        self._searching = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name or getattr(self._searching, "active", False):
            return None
        self._searching.active = True
        try:
            spec = _find_elsewhere(self, fullname, path, target)
        finally:
            self._searching.active = False
        loader = spec.loader if spec is not None else None
        # A loader class (built-in and frozen modules) is shared by many modules: leave it be.
        if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec
        _run_after_exec(loader, self.on_load)
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)  # one module, loaded once: the finder's work is done
        return spec


def _find_elsewhere(
    skip: object, fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> ModuleSpec | None:
    for finder in list(sys.meta_path):
        find_spec = getattr(finder, "find_spec", None)
        if finder is skip or find_spec is None:
            continue
        spec = find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def _run_after_exec(loader: Any, on_load: Callable[[ModuleType], None]) -> None:
    """Wrap this loader instance's ``exec_module`` (file loaders are made per module)."""
    original = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        original(module)
        on_load(module)

    loader.exec_module = exec_module
