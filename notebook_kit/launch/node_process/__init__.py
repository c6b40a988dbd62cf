"""The node process: one node of a cluster run, forked by its node task's zygote.

``process:main`` runs the node's ranks as a launch (``launch``) or a pool (``pooling``) and
sends their events to the node task through ``relay``; a rank's pdb prompts go home through
``node_debugger``, and the lines typed in the kernel's cell come back the same way.

Runs on a node, never in the kernel; imports no engine (the node task is engine-neutral).
"""

__all__: list[str] = []  # the zygote imports ``process`` by name
