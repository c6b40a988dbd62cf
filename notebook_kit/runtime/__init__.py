"""Per-process state of a launched process: what any process of a launch reads while it trains.

The launch context (rank, world size, stop flag) and the hooks run when a launch becomes
active, the worker half of the metrics and progress channels, the stop vote that makes every
rank stop at the same step, the public ``log``/``should_stop``/``progress`` any training loop
may call (``loop``), the process group formed from torchrun's environment, and seeding; and
what every process says to another: the typed messages (``messages``) and the one codec that
turns any message into bytes and back (``codec``).

Runs in every process that trains: a forked worker, the kernel with one process, or a process
torchrun started. Imports only :mod:`notebook_kit.config` and the shared leaf modules.
"""

from notebook_kit.runtime.context import current_launch

__all__ = ["current_launch"]
