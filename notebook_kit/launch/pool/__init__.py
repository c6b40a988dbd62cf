"""The kernel side of ``WorkerPool``: workers forked once that keep their state across cells.

One folder holds this feature's kernel side: the pool itself (``worker_pool``), the launch
settings it refuses and the backend it picks (``options``), what a backend is (``backend``:
the protocol both the local processes and a cluster's nodes implement), what a command carries
to the workers (``shipping``) and whether it reloads edited modules first, with the text a
cluster's nodes need (``reloads``), the processes, forked from the kernel or from its clean
template when it cannot fork safely, and how faults end them (``workers``), how answers
become results or exceptions (``results``) and what the kernel shows of a run (``view``).
The code the workers run is :mod:`notebook_kit.worker.pool`.

Runs in the kernel, as the rest of :mod:`notebook_kit.launch`, and may import what it may.
"""

from notebook_kit.launch.pool.worker_pool import WorkerPool

__all__ = ["WorkerPool"]
