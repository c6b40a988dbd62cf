"""The node process: one node of a cluster run, in the fresh process its node task starts.

A zygote in the engine's worker (:mod:`notebook_kit.node.zygote`) forks it and runs
``process:main``; it reads its ``NodeOrder``, builds its plan from the typed config in it,
and runs this node's ranks with the local launcher (``launch``) or serves a pool's cells on
them (``pooling``), sending its events to the node task through ``relay``.

Runs on a node (never in the kernel). Part of :mod:`notebook_kit.launch`, and imports what it
may; no engine is imported here: the node task it talks to is engine-neutral.
"""

__all__: list[str] = []  # the zygote imports ``process`` by name
