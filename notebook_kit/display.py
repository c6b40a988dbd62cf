"""Choosing what the kernel shows during a launch."""

from __future__ import annotations

from notebook_kit.console import ConsolePrinter
from notebook_kit.observer import LaunchObserver

__all__ = ["default_observer"]


def default_observer(live: bool | None) -> LaunchObserver:
    """The observer a launch uses when the caller gives none."""
    return ConsolePrinter()
