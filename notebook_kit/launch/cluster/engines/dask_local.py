"""A Dask cluster on this machine that survives the notebook's interrupt button.

Jupyter's interrupt button sends SIGINT to the kernel's whole process group. A
``LocalCluster`` made in the notebook runs its scheduler in the kernel and its worker
processes in the kernel's process group, so an interrupt during a cluster run ends every Dask
worker, and the next launch finds none. :func:`local_cluster` starts the same
``LocalCluster`` in a process of its own session (``python -m
notebook_kit.launch.cluster.engines.dask_local``), whose worker processes are its children:
an interrupt reaches only the kernel. That process holds the reading end of a pipe from the
kernel; when the kernel closes the cluster, or dies, the pipe ends and it closes the cluster
and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import weakref
from typing import Any

__all__ = ["LocalDaskCluster", "local_cluster"]

_START_SECONDS = 120.0  # a loaded machine may take this long to start the workers
_CLOSE_SECONDS = 20.0  # then every process of the cluster's session is killed


class LocalDaskCluster:
    """A ``LocalCluster`` running in its own session; pass it as ``cluster=`` or to ``Client``.

    Example::

        with local_cluster(n_workers=2) as cluster:
            client = cluster.get_client()
    """

    def __init__(self, process: subprocess.Popen, started: dict[str, Any]) -> None:
        self._process = process
        self.scheduler_address: str = started["address"]
        self.dashboard_link: str = started.get("dashboard", "")
        self._client: Any = None
        self._finalizer = weakref.finalize(self, _shut_down, process)

    def get_client(self) -> Any:
        """This cluster's ``distributed.Client`` (one per cluster object)."""
        if self._client is None:
            from distributed import Client

            self._client = Client(self.scheduler_address)
        return self._client

    def scale(self, n_workers: int) -> None:
        """Run ``n_workers`` Dask workers (as ``LocalCluster.scale``)."""
        if not isinstance(n_workers, int) or n_workers < 0:
            raise ValueError(f"n_workers must be an int >= 0, got {n_workers!r}.")
        assert self._process.stdin is not None
        self._process.stdin.write(f"scale {n_workers}\n".encode())
        self._process.stdin.flush()

    @property
    def pid(self) -> int:
        """The process holding the cluster (its session leader)."""
        return self._process.pid

    def close(self) -> None:
        """Close the client, the workers and the scheduler; every process of it has ended."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        self._finalizer()

    def __enter__(self) -> LocalDaskCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self._process.poll() is None else "closed"
        return f"LocalDaskCluster({self.scheduler_address!r}, {state})"


def local_cluster(
    n_workers: int = 2,
    threads_per_worker: int = 1,
    *,
    dashboard_address: str | None = "127.0.0.1:0",
    **options: Any,
) -> LocalDaskCluster:
    """Start a Dask ``LocalCluster`` of worker processes that an interrupt does not end.

    ``options`` go to ``distributed.LocalCluster`` (``memory_limit``, ``env``, ``host``, ...;
    JSON values); ``processes`` is always True. The dashboard listens on a free port of the
    loopback address only (``dashboard_address=":8787"`` opens it on every interface);
    ``dashboard_address=None`` starts none, and the scheduler then serves no HTTP at all.

    Example::

        cluster = local_cluster(n_workers=2, threads_per_worker=1)
        notebook_launcher(train, cluster=cluster, num_nodes=2)
        cluster.close()
    """
    if not isinstance(n_workers, int) or n_workers < 0:
        raise ValueError(f"n_workers must be an int >= 0, got {n_workers!r}.")
    if not isinstance(threads_per_worker, int) or threads_per_worker < 1:
        raise ValueError(f"threads_per_worker must be an int >= 1, got {threads_per_worker!r}.")
    if "processes" in options:
        raise ValueError(
            "processes cannot be given: local_cluster always runs worker processes (threads "
            "in one process would share the kernel's interrupt); leave it out."
        )
    settings = {
        "n_workers": n_workers,
        "threads_per_worker": threads_per_worker,
        "dashboard_address": dashboard_address,
        **options,
    }
    try:
        encoded = json.dumps(settings)
    except TypeError as error:
        raise TypeError(f"local_cluster options must be JSON values: {error}") from None
    process = subprocess.Popen(
        [sys.executable, "-m", "notebook_kit.launch.cluster.engines.dask_local", encoded],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,  # out of the kernel's process group: interrupts miss it
    )
    started = _read_start(process)
    return LocalDaskCluster(process, started)


def _read_start(process: subprocess.Popen) -> dict[str, Any]:
    assert process.stdout is not None
    deadline = time.monotonic() + _START_SECONDS
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([process.stdout], [], [], max(left, 0))
        chunk = os.read(process.stdout.fileno(), 65536) if ready else b""
        if not chunk:
            _shut_down(process)
            why = "ended" if ready else f"did not start within {_START_SECONDS:g} s"
            raise RuntimeError(f"The local Dask cluster {why}; its log is above.")
        line += chunk
    started = json.loads(line)
    if "error" in started:
        _shut_down(process)
        raise RuntimeError(f"The local Dask cluster did not start: {started['error']}")
    return started


def _shut_down(process: subprocess.Popen) -> None:
    """Close the pipe (the cluster closes itself), then end whatever of its session is left."""
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=_CLOSE_SECONDS)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # its worker processes share its group
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=_CLOSE_SECONDS)
    if process.stdout is not None:
        process.stdout.close()


def _serve(encoded: str) -> None:
    """In the cluster's own process: start the cluster, say where it is, obey the pipe."""
    from distributed import LocalCluster

    options = json.loads(encoded)
    dashboard = options["dashboard_address"] is not None
    if not dashboard:
        # Without a dashboard Dask's scheduler still serves its other pages (health, metrics,
        # an info page) on port 8787 of its host: bound to a loopback port, closed at start.
        extra = {**(options.get("scheduler_kwargs") or {}), "dashboard": False}
        options.update(dashboard_address="127.0.0.1:0", scheduler_kwargs=extra)
    try:
        cluster = LocalCluster(processes=True, **options)
        if not dashboard:
            cluster.sync(_stop_http, cluster.scheduler)
    except Exception as error:
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
        return
    link = cluster.dashboard_link if dashboard else ""
    print(json.dumps({"address": cluster.scheduler_address, "dashboard": link}), flush=True)
    try:
        for line in sys.stdin:
            command = line.split()
            if command[:1] == ["scale"] and len(command) == 2:
                cluster.scale(int(command[1]))
    finally:  # the kernel closed the cluster or died
        with contextlib.suppress(Exception):
            cluster.close(timeout=_CLOSE_SECONDS / 2)


async def _stop_http(scheduler: Any) -> None:
    """Close the scheduler's HTTP server (on its event loop, which owns the socket)."""
    scheduler.http_server.stop()


if __name__ == "__main__":
    _serve(sys.argv[1])
    with contextlib.suppress(ProcessLookupError):
        os.killpg(0, signal.SIGKILL)  # any worker process that outlived the close, and this
