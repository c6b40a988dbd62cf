"""Module paths that earlier documentation showed, still importable after the move into subpackages.

``from notebook_kit.export import export_notebook`` and ``python -m notebook_kit.script_entry``
keep working: each old name is an alias of the module that now holds the code.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType

__all__ = ["MOVED", "install"]

MOVED = {
    "notebook_kit.accelerator_checkpoints": "notebook_kit.accelerator.configuration",
    "notebook_kit.export": "notebook_kit.cli.export",
    "notebook_kit.script_entry": "notebook_kit.cli.script_entry",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the module at its new path (and gives ``python -m`` its code)."""

    def __init__(self, new_name: str) -> None:
        self.new_name = new_name
        self.own_spec: ModuleSpec | None = None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new_name)
        self.own_spec = module.__spec__  # the import system is about to replace it
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module at the new path is already executed."""
        module.__spec__ = self.own_spec

    def get_code(self, fullname: str) -> CodeType | None:
        spec = importlib.util.find_spec(self.new_name)
        loader = spec.loader if spec else None
        return loader.get_code(self.new_name) if hasattr(loader, "get_code") else None


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new_name))


def install() -> None:
    """Make the old paths importable (once per process)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
