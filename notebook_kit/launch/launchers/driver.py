"""Choosing the launcher for a plan, and driving its steps from blocking or awaiting code: only
the waiting differs (on an executor thread when awaited, so widget events are served)."""

from __future__ import annotations

import asyncio
from multiprocessing.connection import wait
from typing import Any

from notebook_kit.config.launch_plan import LaunchPlan
from notebook_kit.launch.calling_process import torchrun_place
from notebook_kit.launch.cluster.cluster_plan import ClusterPlan
from notebook_kit.launch.launchers.base import Launcher, Steps
from notebook_kit.launch.launchers.cluster import ClusterLauncher
from notebook_kit.launch.launchers.forked import ForkedLauncher
from notebook_kit.launch.launchers.kernel_and_torchrun import InKernelLauncher, TorchrunLauncher

__all__ = ["run_awaitable", "run_blocking", "select_launcher"]


def select_launcher(plan: LaunchPlan | ClusterPlan) -> Launcher:
    """The launcher that runs ``plan``: a cluster's nodes, torchrun's processes, this
    kernel, or forked workers.

    Example::

        select_launcher(resolve_plan({"num_processes": 2}, "notebook_launcher"))
        # a ForkedLauncher
    """
    if isinstance(plan, ClusterPlan):
        return ClusterLauncher(plan)
    if torchrun_place() is not None:
        return TorchrunLauncher(plan)
    if plan.in_process:
        return InKernelLauncher(plan)
    return ForkedLauncher(plan)


def run_blocking(steps: Steps) -> Any:
    """Drive a launcher's steps, blocking in ``wait``; what the launch returned.

    Example::

        run_blocking(select_launcher(plan).run(call, observer=None))
    """
    try:
        request = next(steps)
        while True:
            try:
                ready = wait(*request)
            except BaseException as error:  # Ctrl-C: the launcher cleans up, then re-raises
                request = steps.throw(error)
            else:
                request = steps.send(ready)
    except StopIteration as finished:
        return finished.value


async def run_awaitable(steps: Steps) -> Any:
    """Drive a launcher's steps, waiting on an executor thread; what the launch returned.

    Example::

        await run_awaitable(select_launcher(plan).run(call, observer=None))
    """
    loop = asyncio.get_running_loop()
    try:
        request = next(steps)
        while True:
            try:
                ready = await loop.run_in_executor(None, wait, *request)
            except BaseException as error:  # cancelled or interrupted: clean up, re-raise
                request = steps.throw(error)
            else:
                request = steps.send(ready)
    except StopIteration as finished:
        return finished.value
