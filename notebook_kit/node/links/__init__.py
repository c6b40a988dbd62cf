"""One node-side link per engine (``dask``, ``ray``).

Each holds its engine's :class:`~notebook_kit.node.task.NodeLink`, node task entry and probe
task, and imports only its own engine; the run loop (:mod:`notebook_kit.node.task`) is neutral.
"""

__all__: list[str] = []  # each engine's kernel side imports its own link
