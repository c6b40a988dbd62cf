"""The worker side of ``WorkerPool``: what a pool worker runs between the kernel's commands.

One folder holds this feature's worker side: the loop that waits for a command, runs it and
answers (``command_loop``), the namespace that stays between cells and how kernel definitions
land in it (``namespace``), how the kernel interrupts the code a worker runs
(``interrupt``), and how edited modules of the user's own are reloaded before a command
(``reloading``). The kernel side is :mod:`notebook_kit.launch.pool`.

Runs in a forked worker, as the rest of :mod:`notebook_kit.worker`, and may import what it may.
"""
