"""One node-side link per engine: how a node task reaches its kernel on that engine's cluster.

Each link (``dask``, ``ray``) implements :class:`~notebook_kit.node.task.NodeLink` (read the
control value, publish node 0's address, send events, read pool commands) and holds that
engine's task entry and probe. The run loop itself (:mod:`notebook_kit.node.task`) is neutral.

Runs in an engine's worker process. Part of :mod:`notebook_kit.node`, and imports what it may;
each module imports only its own engine.
"""

__all__: list[str] = []  # each engine's kernel side imports its own link
