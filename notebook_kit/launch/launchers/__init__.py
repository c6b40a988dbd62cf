"""The ways to run a launch, one class each behind one interface, and the driver that runs them.

:class:`~notebook_kit.launch.launchers.base.Launcher` states what every way to run must do;
:func:`~notebook_kit.launch.launchers.driver.select_launcher` picks one for a plan: the kernel
itself (``InKernelLauncher``), torchrun's processes (``TorchrunLauncher``), forked workers
(``ForkedLauncher``; a :class:`~notebook_kit.WorkerPool` keeps its forked workers) or the nodes
of a cluster, on any engine (``ClusterLauncher``). The
blocking and the awaitable entry points drive the chosen launcher's steps with
:func:`~notebook_kit.launch.launchers.driver.run_blocking` and ``run_awaitable``.

Runs in the kernel; part of :mod:`notebook_kit.launch`, and imports what it may.
"""

from notebook_kit.launch.launchers.base import Launcher
from notebook_kit.launch.launchers.driver import run_awaitable, run_blocking, select_launcher

__all__ = ["Launcher", "run_awaitable", "run_blocking", "select_launcher"]
