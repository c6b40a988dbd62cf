"""A package's public names imported on first use (PEP 562), so importing it stays cheap."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, homes: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name in ``homes`` is imported
    from its submodule (relative to ``package``) on first access, then kept in the package.

    Example::

        __getattr__, __dir__ = lazy_names(__name__, {"TensorBoardTracker": "named_trackers"})
    """
    space = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = homes.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        space[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*space, *homes})

    return __getattr__, __dir__
