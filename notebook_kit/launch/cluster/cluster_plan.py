"""A cluster run's options, checked in the kernel before anything starts: the ``ClusterPlan``.

It is what ``select_launcher`` is handed for ``cluster=`` (a cluster run resolves no local
``LaunchPlan``: each node resolves its own). Light to import: Dask is loaded only to reach the
client.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from notebook_kit.config.launch_config import (
    LaunchConfig,
    default_config_path,
    resolve_launch_config,
    saved_default,
)
from notebook_kit.config.launch_plan import DEFAULT_RENDEZVOUS_TIMEOUT, DEFAULT_STALL_SECONDS
from notebook_kit.config.schema import (
    CALL_SETTINGS,
    SETTINGS,
    check_argument,
    scoped,
    settings_from_environ,
)
from notebook_kit.launch.cluster.engine import Engine, engine_for
from notebook_kit.launch.plan import (
    check_explicit_settings,
    check_memory_history,
    collective_timeout,
    parallelism_sizes,
)
from notebook_kit.node.protocol import NodeSettings, ProbeReport

__all__ = [
    "CLUSTER_REFUSES",
    "KERNEL_KEEPS",
    "NODE_SETTINGS",
    "ClusterPlan",
    "check_cluster_mesh",
    "resolve_cluster_plan",
]

# Each setting's scope in the schema places it on a cluster, as these names say: what every
# node's launcher is given (node 0's probe fills num_processes), what the kernel keeps, and
# what the cluster decides, so a value given for it is refused before anything starts.
NODE_SETTINGS = tuple(scoped("node"))
KERNEL_KEEPS = tuple(scoped("kernel"))
CLUSTER_REFUSES = {name: setting.cluster_decides for name, setting in scoped("cluster").items()}


@dataclass(frozen=True)
class ClusterPlan:
    """A cluster run's checked options: what every node gets, and what the kernel keeps."""

    engine: Engine  # the cluster's (a DaskEngine around the distributed.Client)
    settings: NodeSettings  # what every node's launcher is given
    num_nodes: int | None
    max_restarts: int
    live: bool | None
    timeout: float | None
    min_nodes: int | None = None  # None: every attempt runs on num_nodes nodes


def resolve_cluster_plan(cluster: Any, options: Mapping[str, Any]) -> ClusterPlan:
    """Check the options and reach the cluster's engine; nothing has started when this raises.

    ``options`` are the launcher's keyword arguments.
    """
    settings, extra = _settings(options)
    return ClusterPlan(engine_for(cluster), settings, **extra)


def check_cluster_mesh(settings: NodeSettings, reports: list[ProbeReport]) -> None:
    """Refuse the launch's mesh for the nodes the probe found, before any node starts.

    Only now are the nodes counted and, without ``num_processes``, their ranks (one per GPU
    of node 0): a mesh that needs another world size, a shard group that would span nodes,
    replicas alone, or context parallel or ``memory_history`` on nodes whose ranks would train
    on the CPU.

    Raises:
        ValueError: Naming the setting and the fix, as a local launch does.
    """
    config = settings.config
    ranks = config.num_processes or 1  # filled from the probe by with_processes
    gpus = min(report.gpus for report in reports)
    cuda = config.backend != "gloo" and 0 < ranks <= gpus  # as each node's plan decides
    parallelism_sizes(config, ranks, num_nodes=len(reports), device="cuda" if cuda else "cpu")
    check_memory_history(config, "cuda" if cuda else "cpu")


def _settings(options: Mapping[str, Any]) -> tuple[NodeSettings, dict[str, Any]]:
    """The options every node gets, and the ones the kernel keeps; checked before anything.

    As for a local launch, a setting not given comes from ``config``, else from the
    ``NOTEBOOK_KIT_<NAME>`` variables and the saved default.
    """
    config = options.get("config")
    if config is not None and not isinstance(config, LaunchConfig):
        raise TypeError(f"config must be a LaunchConfig, got {type(config).__name__}.")
    stored = _stored(config)
    _refuse_what_the_cluster_decides(options, config, stored)
    honoured = {n: s for n, s in SETTINGS.items() if "cluster" not in s.scope}
    given = {n: options.get(s.keyword) for n, s in honoured.items() if n != "num_nodes"}
    explicit = check_explicit_settings(given)
    # The cluster numbers the nodes: resolved as one node, so no loopback check applies.
    resolved = resolve_launch_config(config, **explicit, num_nodes=1, node_rank=0)
    # What the kernel keeps goes to the nodes at its default: it restarts and shows them all.
    kept = {n: s.default for n, s in honoured.items() if "kernel" in s.scope}
    rendezvous = options.get("rendezvous_timeout", DEFAULT_RENDEZVOUS_TIMEOUT)
    stall = options.get("stall_seconds", DEFAULT_STALL_SECONDS)
    settings = NodeSettings(
        resolved.replace(**kept),
        check_argument(CALL_SETTINGS["rendezvous_timeout"], rendezvous),
        check_argument(CALL_SETTINGS["stall_seconds"], stall),
        check_argument(CALL_SETTINGS["post_mortem"], options.get("post_mortem")) or False,
        collective_timeout(),
    )
    num_nodes = check_argument(SETTINGS["num_nodes"], options.get("num_nodes"))
    if num_nodes is None and stored["num_nodes"] != SETTINGS["num_nodes"].default:
        num_nodes = stored["num_nodes"]  # else: one node per host
    min_nodes = check_argument(CALL_SETTINGS["min_nodes"], options.get("min_nodes"))
    if min_nodes is not None and num_nodes is not None and min_nodes > num_nodes:
        raise ValueError(
            f"min_nodes={min_nodes} is more than num_nodes={num_nodes}: an attempt runs on "
            f"min_nodes to num_nodes nodes. Lower min_nodes, or raise num_nodes."
        )
    extra = {
        "num_nodes": num_nodes,
        "max_restarts": resolved.max_restarts,
        "live": resolved.live,
        "timeout": check_argument(CALL_SETTINGS["timeout"], options.get("timeout")),
        "min_nodes": min_nodes,
    }
    return settings, extra


def _refuse_what_the_cluster_decides(
    options: Mapping[str, Any], config: LaunchConfig | None, stored: Mapping[str, Any]
) -> None:
    """A value for what the cluster decides: given here, in ``config``, a variable or the
    saved default, it is refused rather than silently replaced."""
    for name, setting in scoped("cluster").items():
        given, why = options.get(setting.keyword), setting.cluster_decides
        if name not in SETTINGS:  # isolate: a call's yes/no, never stored
            if given:
                raise ValueError(f"{setting.keyword}=True has no meaning with cluster=: {why}.")
            continue
        if given is not None:
            raise ValueError(
                f"{setting.keyword} is chosen by the cluster when cluster= is given ({why}); "
                f"leave {setting.keyword} unset."
            )
        if stored[name] != setting.default:
            raise ValueError(
                f"{name}={stored[name]!r} {_origin(config, setting.env_var)} is chosen by the "
                f"cluster when cluster= is given ({why}); remove it there for cluster runs."
            )


def _stored(config: LaunchConfig | None) -> dict[str, Any]:
    """The settings as ``config``, else the variables over the saved default, give them."""
    if config is not None:
        return config.to_dict()
    base = (saved_default() or LaunchConfig()).to_dict()
    return {**base, **settings_from_environ(os.environ)}


def _origin(config: LaunchConfig | None, env_var: str) -> str:
    if config is not None:
        return "from config="
    if env_var in os.environ:
        return f"from ${env_var}"
    return f"from {default_config_path()}"
