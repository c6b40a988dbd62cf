"""How launches start their workers, chosen as ``torch.multiprocessing.set_start_method`` is.

``"auto"`` (the default) forks the kernel when that is safe and otherwise starts the workers
from the kernel's clean template process (:mod:`notebook_kit.launch.template`); ``"fork"``
always forks, so a kernel holding a CUDA context or a process group gets
:class:`~notebook_kit.launch.preflight.ForkSafetyError`; ``"template"`` always starts them
from the template. ``NOTEBOOK_KIT_START_METHOD`` sets the default for a process.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["START_METHODS", "get_start_method", "set_start_method"]

START_METHODS = ("auto", "fork", "template")
_ENV = "NOTEBOOK_KIT_START_METHOD"
_chosen: str | None = None


def set_start_method(method: str) -> None:
    """Choose how launches start their workers: ``"auto"``, ``"fork"`` or ``"template"``.

    ``"template"`` also starts the template process now, in the background (a fresh
    interpreter importing torch takes seconds): called in the import cell, it is ready by the
    first launch.

    Example:
        >>> set_start_method("auto")
    """
    global _chosen
    _chosen = _check(method, "set_start_method")
    if _chosen == "template":
        from notebook_kit.launch.template import start_template  # it imports the launch's code

        start_template()


def get_start_method() -> str:
    """The chosen start method; else ``NOTEBOOK_KIT_START_METHOD``; else ``"auto"``.

    Example:
        >>> get_start_method() in START_METHODS
        True
    """
    if _chosen is not None:
        return _chosen
    return _check(os.environ.get(_ENV, "auto") or "auto", _ENV)


def _check(method: Any, name: str) -> str:
    if method not in START_METHODS:
        raise ValueError(
            f"{name}: start method {method!r} is not one of {', '.join(START_METHODS)}. Use "
            "'auto' (fork when the kernel is safe to fork, else start workers from a clean "
            "process), 'fork' (always fork the kernel) or 'template' (always the clean process)."
        )
    return str(method)
