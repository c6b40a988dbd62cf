"""What a ``WorkerPool`` takes of a launch's settings, checked before anything starts.

A pool keeps its workers' state, so the settings that would rerun or move a command are
refused with what to use instead rather than accepted and ignored; a cluster pool is checked
as a cluster launch is (:mod:`notebook_kit.launch.cluster.cluster_plan`). :func:`pool_backend`
chooses the backend the pool's workers run on, with the plan it starts them from.

Runs in the kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from notebook_kit.config import arguments
from notebook_kit.config.launch_config import LaunchConfig
from notebook_kit.config.launch_plan import (
    DEFAULT_RENDEZVOUS_TIMEOUT,
    DEFAULT_STALL_SECONDS,
    LaunchPlan,
)
from notebook_kit.launch.launcher import resolve_plan
from notebook_kit.launch.pool.backend import PoolBackend
from notebook_kit.launch.pool.reloads import ReloadMode
from notebook_kit.launch.pool.shipping import DEFAULT_SEND_LIMIT
from notebook_kit.launch.pool.workers import PoolProcesses
from notebook_kit.launch.preflight import start_route

if TYPE_CHECKING:
    from notebook_kit.launch.cluster.cluster_plan import ClusterPlan

__all__ = ["cluster_plan", "pool_arguments", "pool_backend", "refuse_launch_only"]


def pool_backend(
    cluster: Any, options: dict[str, Any], send_limit: int
) -> tuple[LaunchPlan | ClusterPlan, type[PoolBackend]]:
    """The plan a pool's workers start from, and the backend that starts them: the nodes of
    ``cluster``, or processes forked from this kernel (or by its clean template process)."""
    if cluster is not None:
        from notebook_kit.launch.cluster.pool import ClusterNodes  # the engine, only when asked

        return cluster_plan(cluster, options, send_limit), ClusterNodes
    plan = resolve_plan(options, "WorkerPool", isolate=True)
    if plan.num_nodes != 1:
        raise ValueError(
            f"num_nodes={plan.num_nodes}: a WorkerPool runs on this node only. "
            "Use notebook_launcher (or `notebook-kit launch`) for a job across nodes, "
            "or cluster= for a pool on a Dask cluster's machines."
        )
    # 'fork' on a kernel that cannot fork safely: refused before anything starts
    start_route(plan.kernel, "WorkerPool", plan.start_method)
    return plan, PoolProcesses


def refuse_launch_only(max_restarts: Any, isolate: Any, min_nodes: Any) -> None:
    """Refuse what only a one-off launch means, instead of accepting and ignoring it."""
    if min_nodes is not None:
        raise ValueError(
            f"min_nodes={min_nodes!r}: a WorkerPool never restarts on fewer nodes (its "
            "workers' state would be lost). Leave it out; notebook_launcher(..., cluster=..., "
            "max_restarts=N, min_nodes=K) restarts a run on the nodes that remain."
        )
    if max_restarts is not None and arguments.check_int("max_restarts", max_restarts, minimum=0):
        raise ValueError(
            f"max_restarts={max_restarts}: a WorkerPool never reruns a command (its workers' "
            "state would be lost with them). Leave it out; after a failure, pool.restart() "
            "starts new workers, and notebook_launcher(..., max_restarts=N) restarts a launch."
        )
    if arguments.check_bool("isolate", isolate) is not True:
        raise ValueError(
            "isolate=False: a WorkerPool always runs its ranks in forked workers. Leave it "
            "out, or use notebook_launcher(..., num_processes=1) to run in this kernel."
        )


def cluster_plan(cluster: Any, options: dict[str, Any], send_limit: int) -> ClusterPlan:
    """Check what a cluster pool can honour before anything starts (docs/cluster.md)."""
    from notebook_kit.launch.cluster.cluster_plan import resolve_cluster_plan

    if send_limit != DEFAULT_SEND_LIMIT:
        raise ValueError(
            "send_limit= is not supported with cluster= yet: leave it at its default "
            "(64 MiB is sent to every node at most)."
        )
    return resolve_cluster_plan(cluster, options)


def pool_arguments(
    self: Any,
    num_processes: int | None = None,
    *,
    mixed_precision: arguments.MixedPrecision | None = None,
    gradient_accumulation_steps: int | None = None,
    backend: arguments.Backend | None = None,
    seed: int | None = None,
    master_addr: str | None = None,
    use_port: int | None = None,
    num_nodes: int | None = None,
    node_rank: int | None = None,
    threads_per_process: int | None = None,
    live: bool | None = None,
    max_restarts: int | None = None,
    fsdp: bool | None = None,
    parallelism_config_dp_replicate_size: int | None = None,
    parallelism_config_dp_shard_size: int | None = None,
    parallelism_config_tp_size: int | None = None,
    parallelism_config_cp_size: int | None = None,
    storage_timeout: int | None = None,
    memory_history: bool | None = None,
    start_method: arguments.StartMethod | None = None,
    timeout: float | None = None,
    rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT,
    isolate: bool = True,
    stall_seconds: float | None = DEFAULT_STALL_SECONDS,
    min_nodes: int | None = None,
    post_mortem: bool = False,
    config: LaunchConfig | None = None,
    send_limit: int = DEFAULT_SEND_LIMIT,
    cluster: Any = None,
    reload: ReloadMode | None = None,
) -> None:
    """The arguments of :class:`WorkerPool`, written out for ``help()`` and type checkers."""
