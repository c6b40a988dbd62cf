"""Checking every chosen worker before any rank starts (:mod:`notebook_kit.node.probe`)."""

from __future__ import annotations

import sys
from typing import Any

from notebook_kit.node.probe import probe_version, probe_worker
from notebook_kit.node.protocol import ProbeReport

__all__ = ["ClusterSetupError", "check_reports", "probe_workers"]

PROBE_TIMEOUT_SECONDS = 60.0


class ClusterSetupError(RuntimeError):
    """A chosen Dask worker cannot run this launch; the message names it and the fix."""


def probe_workers(client: Any, workers: list[str], payload: bytes) -> list[ProbeReport]:
    """Run the probe on each worker (never elsewhere, never retried) and gather the reports."""
    node0_host = workers[0].split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    futures = [
        client.submit(
            probe_worker,
            payload,
            node0_host,
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
        raise ClusterSetupError(
            f"The probe of the chosen Dask workers did not answer within "
            f"{PROBE_TIMEOUT_SECONDS:g} s ({', '.join(workers)}): each needs a free thread. "
            f"Wait for running tasks to finish, or add workers."
        ) from error
    finally:
        client.cancel(futures, force=True)


def check_reports(reports: list[ProbeReport]) -> None:
    """Raise for the first worker that differs from the kernel or cannot run its share."""
    here = {
        "torch": probe_version("torch"),
        "notebook_kit": probe_version("notebook_kit"),
        "python": ".".join(map(str, sys.version_info[:2])),
    }
    for node, report in enumerate(reports):
        where = f"node {node} (Dask worker {report.worker}, host {report.hostname})"
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
            raise ClusterSetupError(
                f"The function and its arguments cannot be rebuilt on {where}: "
                f"{report.rebuild_error}. Install the modules it imports there, or define "
                f"what it uses in the notebook (cloudpickle sends cell definitions by value)."
            )
        if report.interface is None:
            raise ClusterSetupError(
                f"{where} has no network interface that reaches node 0 at "
                f"{reports[0].host}. Open the route (and the firewall) between the workers."
            )
