"""What runs after the fork: a worker's entry point and how it joins the launch's process group.

Everything here runs in a forked child of the kernel and leaves through ``os._exit``. The
kernel side that forks and supervises these workers is :mod:`notebook_kit.launch`. A pool
worker runs ``pool_loop.serve_pool`` as its function: it answers the kernel's commands in a
namespace that stays (``pool_namespace``) and can be interrupted (``pool_interrupt``).

May import :mod:`notebook_kit.runtime` and :mod:`notebook_kit.config`; never the kernel side.
"""
