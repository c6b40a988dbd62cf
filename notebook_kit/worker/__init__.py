"""What runs after the fork: the launch's guardian, a worker's entry point, and how a worker
joins the launch's process group.

Everything here runs in a forked child of the kernel (the guardian) or of the guardian (the
workers) and leaves through ``os._exit``. The kernel side that forks the guardian and
supervises the workers is :mod:`notebook_kit.launch`. A pool worker runs
``pool.command_loop.serve_pool`` as its function: it answers the kernel's commands in a
namespace that stays (``pool.namespace``) and can be interrupted (``pool.interrupt``).

May import :mod:`notebook_kit.runtime` and :mod:`notebook_kit.config`; never the kernel side.
"""
