"""The kernel's side of each cluster engine: one module per engine, named for it.

``dask`` (with ``dask_local``, the interrupt-proof ``local_cluster``) and ``ray`` each
implement :class:`~notebook_kit.launch.cluster.engine.Engine`. Dask and Ray are imported only
here, in the files named for them.

Runs in the kernel. Part of :mod:`notebook_kit.launch`, and imports what it may.
"""

__all__: list[str] = []
