"""Choosing what the kernel shows during a launch."""

from __future__ import annotations

from notebook_kit.live.headless import HeadlessObserver, QuietObserver
from notebook_kit.live.observer import LaunchObserver

__all__ = ["default_observer", "notebook_front_end", "prepare_live_view"]


def notebook_front_end() -> bool:
    """True inside a Jupyter kernel that can show widgets (not plain python or terminal IPython).

    Any failure of the probe means "no": the text display always works.

    Example:
        >>> notebook_front_end()
        False
    """
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
            return False
        import ipywidgets  # noqa: F401  (the live view needs it)
    except Exception:
        return False
    return True


def default_observer(live: bool | None) -> LaunchObserver:
    """The observer a launch uses when the caller gives none.

    ``live=False`` shows only errors; otherwise a notebook gets the live view (plot, progress,
    per-rank output, Stop button) and anything else prints compact progress lines.

    Example:
        >>> observer = default_observer(None)
    """
    if live is False:
        return QuietObserver()
    if notebook_front_end():
        from notebook_kit.live.notebook_view import (
            LiveObserver,  # widgets and matplotlib load only here
        )

        return LiveObserver()
    return HeadlessObserver()


def prepare_live_view(live: bool | None) -> None:
    """Import the live view's modules now (seconds, the first time), not while workers run.

    A launch builds its view right after the fork, while the workers start; the widgets take
    milliseconds, but the first import of ipywidgets and matplotlib takes seconds, and an
    interrupt is held while the view is built. So launchers call this before they fork.

    Example::

        prepare_live_view(None)  # in a notebook: ipywidgets and matplotlib are loaded
    """
    if live is not False and notebook_front_end():
        import notebook_kit.live.notebook_view  # noqa: F401
