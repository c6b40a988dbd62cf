"""What runs inside a Dask worker for a cluster run: the probe and the node task.

A cluster run (:mod:`notebook_kit.launch.cluster`) submits two kinds of Dask tasks: the probe
(``probe``), which checks a worker before anything starts, and the node task (``task``), which
starts a fresh node process (``python -m notebook_kit.launch.cluster.node_process``, never a
fork of the multithreaded Dask worker), relays its events through the scheduler, and ends it
when the kernel asks, when the kernel's lease runs out or when the worker dies. The messages
between the kernel, the task and the node process are the dataclasses of ``protocol``.

Runs in a Dask worker process. May import :mod:`notebook_kit.runtime` and
:mod:`notebook_kit.config`, never the launcher: the node process is started by module name.
"""
