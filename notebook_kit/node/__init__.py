"""What runs inside a Dask worker for a cluster run: the probe and the node task.

A cluster run (:mod:`notebook_kit.launch.cluster`) submits two kinds of Dask tasks: the probe
(``probe``), which checks a worker before anything starts, and the node task (``task``), which
has the worker's ``zygote`` fork its node process (never a fork of the multithreaded Dask
worker itself), relays its events through the scheduler, and ends it when the kernel asks,
when the kernel's lease runs out or when the worker dies. The messages between the kernel, the
task and the node process are the dataclasses of ``protocol``, sent as plain data sealed with
the run's secret (``codec``). ``links`` holds each engine's
side of it (``links.dask``, ``links.ray``).

Runs in a Dask worker process (or a Ray worker). May import :mod:`notebook_kit.runtime` and
:mod:`notebook_kit.config`, never the launcher: the zygote imports and runs the node process's
module by name.
"""
