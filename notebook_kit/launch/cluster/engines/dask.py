"""From ``cluster=`` to a Dask client and one chosen worker per node."""

from __future__ import annotations

from typing import Any

__all__ = ["INSTALL_HINT", "choose_workers", "current_workers", "dask_client"]

INSTALL_HINT = "pip install 'notebook_kit[cluster]'  (installs dask and distributed)"


def dask_client(cluster: Any) -> Any:
    """The ``distributed.Client`` for ``cluster=``: a Client, or an object with ``get_client()``.

    Raises:
        ImportError: Dask's ``distributed`` is not installed (the message says how to).
        TypeError: ``cluster`` is neither.
    """
    try:
        from distributed import Client
    except ImportError as error:
        raise ImportError(
            f"cluster= runs the launch on a Dask cluster, which needs dask and distributed: "
            f"{INSTALL_HINT}."
        ) from error
    if isinstance(cluster, Client):
        return cluster
    get_client = getattr(cluster, "get_client", None)
    if callable(get_client):
        client = get_client()
        if isinstance(client, Client):
            return client
    raise TypeError(
        f"cluster must be a distributed.Client or a cluster object with .get_client() "
        f"(LocalCluster, coiled.Cluster, SLURMCluster, ...), got {type(cluster).__name__}."
    )


def current_workers(client: Any) -> dict[str, dict[str, Any]]:
    """The scheduler's workers now, asked directly.

    ``Client.scheduler_info()`` returns a cached copy that the client's own periodic refresh
    may have just replaced with one listing no workers.
    """
    return dict(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


def choose_workers(
    workers: dict[str, dict[str, Any]], num_nodes: int | None, min_nodes: int | None = None
) -> list[str]:
    """One worker per node: one per distinct host by default; ``num_nodes`` may take several
    workers of one host (how tests run several nodes on one machine). With ``min_nodes``,
    fewer than ``num_nodes`` workers are enough, down to ``min_nodes``.

    Example:
        >>> choose_workers({"tcp://a:1": {"host": "a"}, "tcp://a:2": {"host": "a"}}, 2)
        ['tcp://a:1', 'tcp://a:2']
    """
    by_host: dict[str, list[str]] = {}
    for address in sorted(workers):
        by_host.setdefault(str(workers[address].get("host", address)), []).append(address)
    if num_nodes is None:
        chosen = [addresses[0] for addresses in by_host.values()]
        if len(chosen) < (min_nodes or 1):
            raise ValueError(_too_few(len(chosen), min_nodes or 1))
        return chosen
    if min_nodes is not None and min_nodes <= len(workers) < num_nodes:
        num_nodes = len(workers)
    if num_nodes > len(workers):
        raise ValueError(_too_few(len(workers), num_nodes, min_nodes))
    chosen = []
    depth = 0
    while len(chosen) < num_nodes:  # one per host first, then a second worker of each, ...
        for addresses in by_host.values():
            if depth < len(addresses) and len(chosen) < num_nodes:
                chosen.append(addresses[depth])
        depth += 1
    return chosen


def _too_few(available: int, num_nodes: int, min_nodes: int | None = None) -> str:
    if min_nodes is not None:
        return (
            f"min_nodes={min_nodes} needs at least {min_nodes} Dask workers (one per node), "
            f"but the cluster has {available}. Scale the cluster first "
            f"(cluster.scale({num_nodes}), then client.wait_for_workers({min_nodes})) or "
            "lower min_nodes."
        )
    return (
        f"num_nodes={num_nodes} needs {num_nodes} Dask workers (one per node), but the cluster "
        f"has {available}. Scale the cluster first (cluster.scale({num_nodes}), then "
        f"client.wait_for_workers({num_nodes})) or lower num_nodes."
    )
