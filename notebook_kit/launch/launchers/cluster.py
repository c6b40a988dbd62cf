"""A cluster, on any engine: one node process per chosen worker, each forking its node's ranks.

The kernel's side of the run is :mod:`notebook_kit.launch.cluster`, behind the launcher interface.
"""

from __future__ import annotations

from notebook_kit.launch.cluster.cluster_plan import ClusterPlan
from notebook_kit.launch.launchers.base import Launcher, Steps, prepare_view
from notebook_kit.launch.plan import Call
from notebook_kit.live.observer import LaunchObserver

__all__ = ["ClusterLauncher"]


class ClusterLauncher(Launcher):
    """``num_processes`` ranks on each of ``num_nodes`` workers of a cluster (docs/cluster.md).

    Example::

        value = run_blocking(ClusterLauncher(resolve_cluster_plan(client, options)).run(
            call, observer=None))
    """

    def __init__(self, plan: ClusterPlan) -> None:  # a cluster run resolves no LaunchPlan
        self.cluster_plan = plan

    def run(self, call: Call, observer: LaunchObserver | None) -> Steps:
        from notebook_kit.launch.cluster.run import cluster_steps  # it imports the pool

        if observer is None:
            prepare_view(self.cluster_plan.live)  # the default view, made there, imports now
        return (yield from cluster_steps(call, self.cluster_plan, observer))
