"""The kernel's actors on a Ray cluster (its hub, a keeper per Ray node) and its Ray calls,
for the kernel side of the Ray engine (:mod:`notebook_kit.launch.cluster.engines.ray`).

Runs in the kernel.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from notebook_kit.node.links.ray import NodeKeeper, RunHub

__all__ = ["HUB_SECONDS", "cancel_task", "keeper", "kernel_hub", "remote_once"]

HUB_SECONDS = 10.0  # no call of the kernel to the hub waits longer


def kernel_hub() -> Any:
    """This kernel's hub actor on the cluster it joined: made by the first run and kept by
    the next ones (made again if it died).

    Example::

        ray.get(kernel_hub().runs.remote())  # the runs it holds: [] between runs
    """
    return _kept(RunHub, "hub", "", "runs")


def keeper(node_id: str) -> Any:
    """This kernel's :class:`~notebook_kit.node.links.ray.NodeKeeper` on a Ray node: made by
    the first probe there, kept as the hub is.

    Example::

        ray.get(keeper(node_id).zygote.remote())  # the socket its node processes come from
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    pinned = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return _kept(NodeKeeper, "keeper", node_id, "zygote", scheduling_strategy=pinned)


def _kept(actor: type, kind: str, place: str, ping: str, **options: Any) -> Any:
    """This kernel's ``kind`` actor (at ``place``), with no CPU: made once, and kept while it
    answers ``ping`` (a warm actor answers in milliseconds). It ends with the kernel's Ray
    connection. Its name holds the Ray job's id, so two kernels sharing a Ray namespace each
    have their own; one made again after a death gets a name of its own, as Ray may still
    hold the dead one's."""
    import ray

    job = ray.get_runtime_context().get_job_id()
    key = (job, kind, place)
    made = _actors.get(key)
    if made is not None:
        try:
            ray.get(getattr(made, ping).remote(), timeout=HUB_SECONDS)
            return made
        except Exception:  # it died: make another
            _deaths[key] = _deaths.get(key, 0) + 1
    name = "-".join(p for p in ("notebook_kit", kind, job, place, str(_deaths.get(key, ""))) if p)
    made = _actors[key] = (  # the handle that made it is kept: Ray ends an actor once dropped
        remote_once(actor)
        .options(num_cpus=0, max_restarts=0, name=name, get_if_exists=True, **options)
        .remote()
    )
    return made


_actors: dict[tuple[str, str, str], Any] = {}  # (Ray job, kind, place) -> the kernel's actor
_deaths: dict[tuple[str, str, str], int] = {}  # how many of those died


@functools.cache
def remote_once(function: Callable) -> Any:
    """``ray.remote(function)``, made once: Ray exports a remote function's code to the
    cluster when it is first called, and again for every new ``ray.remote`` of it."""
    import ray

    return ray.remote(function)


def cancel_task(ref: Any) -> None:
    """Cancel a task that has not finished, as Ctrl-C in it would (its ``finally`` runs).

    Never forced: a forced cancel fails the task in the kernel at once, and if its reply is
    arriving meanwhile on Ray's own thread, Ray's check that a task completes only once ends
    the kernel's process (``Tried to complete task that was not pending``)."""
    import ray

    with contextlib.suppress(Exception):
        ray.cancel(ref, force=False)
