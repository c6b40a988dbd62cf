"""Multi-machine runs on a cluster, driven from the kernel: ``notebook_launcher(cluster=)``.

The kernel side is engine-neutral: ``engine`` declares what a run asks of its cluster (the
:class:`~notebook_kit.launch.cluster.engine.Engine` protocol) and finds the engine of a
``cluster=`` value in the table of ``engines`` (Dask, Ray: one module each). Nothing here
manages a cluster. ``cluster_plan`` checks the options, ``probing`` chooses one worker per
node and checks each before anything starts, ``run`` (the steps of ``ClusterLauncher``)
submits one node task per node (:mod:`notebook_kit.node.task`), shows their events in the
same live view as a local launch, and ends every node on a failure, a lost node, Ctrl-C or
``timeout``. What runs on a node is :mod:`notebook_kit.launch.node_process`.

Runs in the kernel. Part of :mod:`notebook_kit.launch`; may import :mod:`notebook_kit.node`
and what launch imports.
"""

__all__: list[str] = []  # nothing imported here: the launcher imports ``cluster_plan`` only
