"""The engine table: which engine takes a ``cluster=`` value, and where its two sides live.

A row of :data:`ENGINES` names an engine's two sides by module path, imported only once a
value is taken, so the table imports no engine (``docs/architecture.md``: adding an engine).

Runs in the kernel. Part of :mod:`notebook_kit.launch`, and imports what it may.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ENGINES", "EngineRow"]


@dataclass(frozen=True)
class EngineRow:
    """One engine: what it takes, and where its sides are (``module:name``)."""

    takes: Callable[[Any], bool]  # a test of the value that imports nothing
    engine: str  # the call that makes the engine from the value (it checks the value fully)
    link: str  # the node-side NodeLink class
    forms: str  # the values it takes, for the message naming every accepted form


# Tried in order: Dask's row, which takes any other object and checks it itself (naming what
# it accepts, or how to install Dask), comes last.
ENGINES: tuple[EngineRow, ...] = (
    EngineRow(
        takes=lambda value: isinstance(value, str),
        engine="notebook_kit.launch.cluster.engines.ray:ray_engine",
        link="notebook_kit.node.links.ray:RayNodeLink",
        forms="'ray' or 'ray://host:port' for a Ray cluster",
    ),
    EngineRow(
        takes=lambda value: not isinstance(value, str),
        engine="notebook_kit.launch.cluster.engines.dask:dask_engine",
        link="notebook_kit.node.links.dask:DaskNodeLink",
        forms="a distributed.Client or a cluster object with .get_client() for Dask",
    ),
)
