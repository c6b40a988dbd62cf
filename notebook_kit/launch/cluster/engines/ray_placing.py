"""Where a run's node tasks go on a Ray cluster: its placement group, checked against the Ray
nodes' size, reserved, and its worker processes started, for the Ray engine
(:mod:`notebook_kit.launch.cluster.engines.ray`).

A node task's bundle holds a CPU per rank (and a GPU per rank where the Ray node has them).
Bundles that a Ray node could never hold, even idle, are refused at once: Ray would otherwise
keep the placement group pending until ``rendezvous_timeout`` passed, and then the reason read
as other work holding the resources. Once the group is ready, a worker process is started in
each bundle before any node task is sent: Ray starts a process for a task only when the task
comes, and on a busy machine or with a runtime environment that takes seconds per process, so
a node task sent at once could stay silent past ``NODE_SILENCE_SECONDS`` and be taken for a
lost node before it ran a line. The node tasks then take those processes, idle and warm.

Runs in the kernel.
"""

from __future__ import annotations

from typing import Any

from notebook_kit.launch.cluster.engines.ray_actors import cancel_task, remote_once
from notebook_kit.launch.cluster.probing import ClusterSetupError
from notebook_kit.node.links.ray import worker_started

__all__ = ["check_room", "reserve", "shape_text", "start_workers", "wait_reserved"]


def check_room(shapes: list[dict[str, float]], nodes: list[str], workers: list[str]) -> None:
    """Refuse bundles that more than fill a Ray node (``nodes[i]`` holds ``shapes[i]``).

    Raises:
        ClusterSetupError: a Ray node has fewer CPUs (or GPUs) in all than the run's nodes
            placed there need, naming it, the need and the fix.
    """
    import ray

    totals = {str(n["NodeID"]): n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")}
    need: dict[str, dict[str, float]] = {}
    for shape, node in zip(shapes, nodes, strict=True):
        for resource, amount in shape.items():
            need.setdefault(node, {}).setdefault(resource, 0.0)
            need[node][resource] += amount
    for node, wanted in need.items():
        for resource, amount in wanted.items():
            has = float(totals.get(node, {}).get(resource, 0.0))
            if amount > has:
                placed = [w for w, n in zip(workers, nodes, strict=True) if n == node]
                raise ClusterSetupError(
                    f"The run's {len(placed)} node(s) on Ray node {node[:8]} ({placed[0]} ...) "
                    f"need {amount:g} {resource}s there, a {resource} per rank "
                    f"({shape_text(shapes[0])} per node), and it has {has:g} in all: Ray could "
                    f"never reserve them. Pass fewer num_processes or num_nodes, or give Ray "
                    f"more: add Ray nodes (ray start --address=HEAD:6379), or, for a Ray "
                    f"instance on this machine, ray.init(num_cpus=...)."
                )


def shape_text(shape: dict[str, float]) -> str:
    """``{"CPU": 8.0}`` as ``8 CPU``."""
    return ", ".join(f"{amount:g} {resource}" for resource, amount in shape.items())


def reserve(shapes: list[dict[str, float]], nodes: list[str]) -> Any:
    """The run's placement group, asked for: a bundle per node, each on its Ray node."""
    from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group

    spread = len(set(nodes)) == len(nodes)
    return placement_group(
        shapes,
        strategy="STRICT_SPREAD" if spread else "SPREAD",
        bundle_label_selector=[{NODE_ID_LABEL_KEY: node} for node in nodes],
    )


def wait_reserved(
    group: Any, shapes: list[dict[str, float]], workers: list[str], bound: float
) -> None:
    """Wait for ``group`` to be ready (the caller removes it, whatever happens).

    Raises:
        ClusterSetupError: Ray did not reserve it within ``bound`` seconds (other work holds
            those resources).
    """
    import ray

    ready, _ = ray.wait([group.ready()], timeout=bound)
    if not ready:
        raise ClusterSetupError(
            f"The Ray cluster did not reserve the run's {len(shapes)} bundles "
            f"({shape_text(shapes[0])} each, on {', '.join(workers)}) within "
            f"rendezvous_timeout={bound:g} s: other work holds those resources. Wait for it to "
            f"end (ray status shows it), or add Ray nodes."
        )


def start_workers(
    group: Any, shapes: list[dict[str, float]], bound: float, hub: Any, run: str
) -> None:
    """A worker process started in each bundle of ``group``, and idle again, for the node
    tasks to take. Each start-up task waits in the run's ``hub`` for the others: Ray would
    give a process that is free again the next start-up task rather than start another.

    Raises:
        ClusterSetupError: Ray did not start them within ``bound`` seconds.
    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    started = remote_once(worker_started)
    refs = [
        started.options(
            num_cpus=shape["CPU"],
            num_gpus=shape.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=index
            ),
        ).remote(hub, run, len(shapes), bound)
        for index, shape in enumerate(shapes)
    ]
    done, waiting = ray.wait(refs, num_returns=len(refs), timeout=bound)
    for ref in waiting:
        cancel_task(ref)
    if waiting:
        raise ClusterSetupError(
            f"Ray had started worker processes for only {len(done)} of the run's {len(refs)} "
            f"node tasks after rendezvous_timeout={bound:g} s: its Ray nodes could not start "
            f"more processes in time (ray status and Ray's logs show why; a runtime_env that "
            f"installs packages takes that long the first time)."
        )
    try:
        ray.get(done)
    except ray.exceptions.RayError as error:  # a process that could not start
        raise ClusterSetupError(
            f"Ray could not start a worker process for a node task ({type(error).__name__}: "
            f"{(str(error).strip().splitlines() or [''])[0]}); Ray's logs say why."
        ) from error
