"""Checking every chosen worker before any rank starts (:mod:`notebook_kit.node.probe`).

Each question is one short Dask task per chosen worker, which needs a free thread there: a
worker whose threads all run other tasks (the user's own, another kernel's run) is named at
once rather than after the probe's timeout.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

from notebook_kit.node.probe import probe_version, probe_worker
from notebook_kit.node.protocol import ProbeReport

__all__ = ["ClusterSetupError", "ask_workers", "check_reports", "probe_workers"]

PROBE_TIMEOUT_SECONDS = 60.0
_MISSING_MODULE = re.compile(r"No module named '([^']+)'")


class ClusterSetupError(RuntimeError):
    """A chosen Dask worker cannot run this launch; the message names it and the fix."""


def probe_workers(client: Any, workers: list[str], payload: bytes) -> list[ProbeReport]:
    """Run the probe on each worker (never elsewhere, never retried) and gather the reports."""
    node0_host = workers[0].split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return ask_workers(client, workers, probe_worker, payload, node0_host)


def ask_workers(client: Any, workers: list[str], function: Callable, *args: Any) -> list[Any]:
    """``function(*args)`` once on each of ``workers``, in their order.

    Raises:
        ClusterSetupError: a worker has no free thread (named before anything is submitted),
            or did not answer within ``PROBE_TIMEOUT_SECONDS`` (only the silent ones named).
    """
    refuse_busy_workers(client, workers)
    futures = [
        client.submit(
            function,
            *args,
            workers=[address],
            allow_other_workers=False,
            pure=False,
            retries=0,
        )
        for address in workers
    ]
    from distributed import wait

    try:
        wait(futures, timeout=PROBE_TIMEOUT_SECONDS)
        return client.gather(futures)
    except TimeoutError as error:
        silent = [
            address for address, future in zip(workers, futures, strict=True) if not future.done()
        ]
        raise ClusterSetupError(
            f"Dask worker{'s' if len(silent) > 1 else ''} {', '.join(silent)} did not answer "
            f"the probe within {PROBE_TIMEOUT_SECONDS:g} s: each chosen worker needs a free "
            f"thread, and a worker too loaded to start a Python process in time cannot run a "
            f"node. Wait for its running tasks to finish, or add workers."
        ) from error
    finally:
        client.cancel(futures, force=True)


def refuse_busy_workers(client: Any, workers: list[str]) -> None:
    """Name the first chosen worker whose every thread runs a task already."""
    from notebook_kit.launch.cluster.engines.dask import current_workers

    known = current_workers(client)
    processing = client.processing(workers)
    for address in workers:
        threads = int(known.get(address, {}).get("nthreads", 1) or 1)
        running = list(processing.get(address, ()))
        if len(running) >= threads:
            shown = ", ".join(map(str, running[:3])) + (", ..." if len(running) > 3 else "")
            raise ClusterSetupError(
                f"Dask worker {address} has no free thread: its {threads} thread"
                f"{'s run' if threads > 1 else ' runs'} other tasks ({shown}), and a node "
                f"needs one for the whole run. Wait for those tasks to finish (or cancel "
                f"them), start the worker with more threads, or add workers."
            )


def check_reports(reports: list[ProbeReport], worker_noun: str, ship_hint: str) -> None:
    """Raise for the first worker that differs from the kernel or cannot run its share.

    ``worker_noun`` names a worker of the engine; ``ship_hint`` how it sends a module to its
    workers (the engine's own words for both)."""
    here = {
        "torch": probe_version("torch"),
        "notebook_kit": probe_version("notebook_kit"),
        "python": ".".join(map(str, sys.version_info[:2])),
    }
    for node, report in enumerate(reports):
        where = f"node {node} ({worker_noun} {report.worker}, host {report.hostname})"
        theirs = {
            "torch": report.torch,
            "notebook_kit": report.notebook_kit,
            "python": ".".join(report.python.split(".")[:2]),
        }
        for name, version in here.items():
            if theirs[name] != version:
                raise ClusterSetupError(
                    f"{where} has {name} {theirs[name]}, the kernel {version}. Every machine "
                    f"needs the same Python environment: install {name}=={version} there "
                    f"(or use the same software environment or image for every worker)."
                )
        if report.rebuild_error:
            raise ClusterSetupError(_cannot_rebuild(where, report.rebuild_error, ship_hint))
        if report.interface is None:
            raise ClusterSetupError(
                f"{where} has no network interface that reaches node 0 at "
                f"{reports[0].host}. Open the route (and the firewall) between the machines."
            )


def _cannot_rebuild(where: str, error: str, ship_hint: str) -> str:
    missing = _MISSING_MODULE.search(error)
    if missing is None:
        return (
            f"The function and its arguments cannot be rebuilt on {where}: {error}. Install "
            f"the modules it imports there, or define what it uses in the notebook "
            f"(cloudpickle sends cell definitions by value)."
        )
    module = missing.group(1)
    return (
        f"The function and its arguments cannot be rebuilt on {where}: its node process "
        f"cannot import module '{module}' ({error}), and the kernel cannot send it (it is "
        f"not Python source the kernel imported). Install '{module.split('.')[0]}' on every "
        f"worker (the same environment as the kernel), or send it with "
        f"{ship_hint}."
    )
