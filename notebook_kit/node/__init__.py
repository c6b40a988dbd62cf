"""What runs inside an engine's worker for a cluster run: the probe and the node task.

A cluster run (:mod:`notebook_kit.launch.cluster`) asks each chosen worker for the probe
(``probe``), which checks it before anything starts, and starts one node task (``task``) per
node, which has the worker's ``zygote`` fork its node process (never a fork of the
multithreaded worker itself), relays its events to the kernel, and ends it when the kernel
asks, when the kernel's lease runs out or when the worker dies. Both are engine-neutral: each
engine's side of them is one module of ``links``, the only ones that import that engine. The
messages between the kernel, the task and the node process are the dataclasses of
``protocol``, sent as plain data sealed with the run's secret (``runtime.codec``).

Runs in an engine's worker process, which never imports torch: the zygote and its children
do, the node process and ``probe_child``, which answers the probe's questions (which modules a
node imports, whether the function unpickles, how many GPUs its torch counts) as a node process
would; it is only the zygote's target, never imported here. May import
:mod:`notebook_kit.runtime` and :mod:`notebook_kit.config`, never the launcher: the zygote
imports and runs the node process's module by name.
"""
