"""How launches start their workers, chosen as ``torch.multiprocessing.set_start_method`` is.

``"auto"`` (the default) forks the kernel when that is safe and otherwise starts the workers
from the kernel's clean template process (:mod:`notebook_kit.launch.template`); ``"fork"``
always forks, so a kernel holding a CUDA context or a process group gets
:class:`~notebook_kit.launch.preflight.ForkSafetyError`; ``"template"`` always starts them
from the template.

``start_method`` is a setting of the schema (:mod:`notebook_kit.config.schema`): a launch's
or a pool's keyword, ``config=``, the panel, ``--start-method``, ``NOTEBOOK_KIT_START_METHOD``
and the saved default all give it. :func:`set_start_method` sets this process's default, which
a launch takes when neither its keyword nor ``config=`` names one, above the variable and the
saved default: what the notebook's own code chose is the nearer choice.
"""

from __future__ import annotations

import os
from typing import Any

from notebook_kit.config.arguments import START_METHOD_CHOICES
from notebook_kit.config.schema import SETTINGS, check_value

__all__ = ["START_METHODS", "chosen_start_method", "get_start_method", "set_start_method"]

START_METHODS = START_METHOD_CHOICES
_SETTING = SETTINGS["start_method"]
_chosen: str | None = None


def set_start_method(method: str) -> None:
    """Choose how this process's launches and pools start their workers: ``"auto"``,
    ``"fork"`` or ``"template"`` (a launch's ``start_method=`` still wins).

    ``"template"`` also starts the template process now, if the kernel has none (it is made
    at ``import notebook_kit`` in a kernel, unless the start method was ``"fork"`` then).

    Example:
        >>> set_start_method("auto")
    """
    global _chosen
    _chosen = _check(method, "set_start_method(): ")
    if _chosen == "template":
        from notebook_kit.launch.template import start_template  # it imports the launch's code

        start_template()


def chosen_start_method() -> str | None:
    """What :func:`set_start_method` chose in this process, None if it was never called.

    Example:
        >>> chosen_start_method() in (None, *START_METHODS)
        True
    """
    return _chosen


def get_start_method() -> str:
    """This process's start method: :func:`set_start_method`'s choice, else
    ``NOTEBOOK_KIT_START_METHOD``, else the saved default's, else ``"auto"``.

    Raises:
        ValueError: the variable, or the saved default, holds something else; it is named.

    Example:
        >>> get_start_method() in START_METHODS
        True
    """
    if _chosen is not None:
        return _chosen
    text = os.environ.get(_SETTING.env_var)
    if text is not None:
        return _check(text.strip(), f"${_SETTING.env_var}={text!r}: ")
    from notebook_kit.config.launch_config import saved_default  # reads a file: when asked

    saved = saved_default()
    return saved.start_method if saved is not None else str(_SETTING.default)


def _check(method: Any, where: str) -> str:
    """``method`` if it is a start method, else a ValueError naming ``start_method``, the
    values and what each does, prefixed with ``where`` it came from."""
    try:
        return str(check_value("start_method", method))
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{where}{error} Use 'auto' (fork when the kernel is safe to fork, else start "
            "workers from a clean process), 'fork' (always fork the kernel) or 'template' "
            "(always the clean process)."
        ) from None
