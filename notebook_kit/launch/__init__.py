"""The kernel side of a launch: everything a notebook cell calls to run a function on N processes.

``notebook_launcher`` resolves a plan, checks the kernel is safe to fork, forks the workers,
supervises them until they finish, brings rank 0's result and weights home and raises the first
failure. With one process (or under torchrun) it runs the function in the calling process. The
:class:`ConfigPanel` form fills a config and launches with it. :class:`WorkerPool` (``pool``)
forks its workers once and runs functions and ``%%distributed`` cells (``magic``) on them.

Runs in the kernel (or the script that calls the launcher). May import every subpackage below
it: :mod:`notebook_kit.worker`, :mod:`notebook_kit.live`, :mod:`notebook_kit.accelerator`,
:mod:`notebook_kit.runtime`, :mod:`notebook_kit.config`.
"""
