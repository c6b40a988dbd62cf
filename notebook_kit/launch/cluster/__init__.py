"""Multi-machine runs on a Dask cluster, driven from the kernel: ``notebook_launcher(cluster=)``.

A Dask ``Client`` (or anything with ``.get_client()``: Coiled, dask-jobqueue, dask-kubernetes,
``LocalCluster``) reaches the machines; nothing here manages a cluster. ``connect`` picks one
worker per node, ``cluster_plan`` checks the options, ``probing`` checks every chosen
worker before anything starts, ``run`` (the steps of ``ClusterLauncher``) submits one node
task per node (:mod:`notebook_kit.node.task`), shows their events in the same live view as a
local launch, and ends every node on a failure, a lost node, Ctrl-C or ``timeout``.
``node_process`` and ``node_relay`` are what runs on a node, in the fresh process the node
task starts.

Runs in the kernel (``node_process``: on a node). Part of :mod:`notebook_kit.launch`; may
import :mod:`notebook_kit.node` and what launch imports.
"""

__all__: list[str] = []  # nothing imported here: the launcher imports ``cluster_plan`` only
