"""A cluster run's options, checked in the kernel before anything starts: the ``ClusterPlan``.

It is what ``select_launcher`` is handed for ``cluster=`` (a cluster run resolves no local
``LaunchPlan``: each node resolves its own). Light to import: Dask is loaded only to reach the
client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from notebook_kit.config.launch_config import LaunchConfig, resolve_launch_config
from notebook_kit.config.launch_plan import DEFAULT_RENDEZVOUS_TIMEOUT
from notebook_kit.config.schema import CALL_SETTINGS, SETTINGS, check_argument
from notebook_kit.launch.cluster.connect import dask_client
from notebook_kit.launch.plan import check_explicit_settings

__all__ = ["ClusterPlan", "resolve_cluster_plan"]

_NODE_SETTINGS = (
    "num_processes", "mixed_precision", "backend", "threads_per_process",
    "gradient_accumulation_steps", "seed",
)  # fmt: skip
_CHOSEN_BY_CLUSTER = ("use_port", "master_addr", "node_rank")


@dataclass(frozen=True)
class ClusterPlan:
    """A cluster run's checked options: what every node gets, and what the kernel keeps."""

    client: Any  # the distributed.Client
    settings: dict[str, Any]  # every node's launcher options (num_processes, backend, ...)
    num_nodes: int | None
    max_restarts: int
    live: bool | None
    timeout: float | None


def resolve_cluster_plan(cluster: Any, options: Mapping[str, Any]) -> ClusterPlan:
    """Check the options and reach the cluster's client; nothing has started when this raises.

    ``options`` are the launcher's keyword arguments.
    """
    settings, extra = _settings(options)
    return ClusterPlan(dask_client(cluster), settings, **extra)


def _settings(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The options every node gets, and the ones the kernel keeps; checked before anything."""
    for name in _CHOSEN_BY_CLUSTER:
        if options.get(name) is not None:
            raise ValueError(
                f"{name} is chosen by the cluster when cluster= is given (node 0 binds its "
                f"own port on its own address); leave {name} unset."
            )
    if options.get("isolate"):
        raise ValueError("isolate=True has no meaning with cluster=: every node forks its ranks.")
    config = options.get("config")
    if config is not None and not isinstance(config, LaunchConfig):
        raise TypeError(f"config must be a LaunchConfig, got {type(config).__name__}.")
    names = (*_NODE_SETTINGS, "max_restarts", "live")
    explicit = check_explicit_settings({name: options.get(name) for name in names})
    resolved = resolve_launch_config(config, **explicit)
    num_nodes = check_argument(SETTINGS["num_nodes"], options.get("num_nodes"))
    rendezvous = options.get("rendezvous_timeout", DEFAULT_RENDEZVOUS_TIMEOUT)
    settings = {name: getattr(resolved, name) for name in _NODE_SETTINGS}
    settings["rendezvous_timeout"] = check_argument(CALL_SETTINGS["rendezvous_timeout"], rendezvous)
    extra = {
        "num_nodes": num_nodes,
        "max_restarts": resolved.max_restarts,
        "live": resolved.live,
        "timeout": check_argument(CALL_SETTINGS["timeout"], options.get("timeout")),
    }
    return settings, extra
