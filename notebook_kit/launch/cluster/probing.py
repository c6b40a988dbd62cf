"""Choosing one worker per node, and checking every chosen one before any rank starts.

Engine-neutral: each engine lists its workers and asks them (``Engine.workers``,
``Engine.ask``); the probe's reports (:mod:`notebook_kit.node.probe`) are checked here against
the kernel, in the engine's own words. An engine's question that gets no answer within
``PROBE_TIMEOUT_SECONDS`` raises :class:`ClusterSetupError`.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from notebook_kit.node.probe import probe_version
from notebook_kit.node.protocol import ProbeReport

__all__ = ["PROBE_TIMEOUT_SECONDS", "ClusterSetupError", "check_reports", "choose_workers"]

PROBE_TIMEOUT_SECONDS = 60.0
_MISSING_MODULE = re.compile(r"No module named '([^']+)'")


class ClusterSetupError(RuntimeError):
    """A chosen worker cannot run this launch; the message names it and the fix."""


def choose_workers(
    workers: dict[str, dict[str, Any]],
    num_nodes: int | None,
    min_nodes: int | None = None,
    worker_noun: str = "worker",
    grow_hint: str = "Add workers",
) -> list[str]:
    """One worker per node: one per distinct host by default; ``num_nodes`` may take several
    workers of one host (how tests run several nodes on one machine). With ``min_nodes``,
    fewer than ``num_nodes`` workers are enough, down to ``min_nodes``. Too few raise
    ``ValueError`` in the engine's words (``worker_noun``, ``grow_hint``).

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
            raise ValueError(_too_few(len(chosen), min_nodes or 1, None, worker_noun, grow_hint))
        return chosen
    if min_nodes is not None and min_nodes <= len(workers) < num_nodes:
        num_nodes = len(workers)
    if num_nodes > len(workers):
        raise ValueError(_too_few(len(workers), num_nodes, min_nodes, worker_noun, grow_hint))
    chosen = []
    depth = 0
    while len(chosen) < num_nodes:  # one per host first, then a second worker of each, ...
        for addresses in by_host.values():
            if depth < len(addresses) and len(chosen) < num_nodes:
                chosen.append(addresses[depth])
        depth += 1
    return chosen


def _too_few(
    available: int, num_nodes: int, min_nodes: int | None, noun: str, grow_hint: str
) -> str:
    if min_nodes is not None:
        needs, lower = f"min_nodes={min_nodes} needs at least {min_nodes}", "min_nodes"
    else:
        needs, lower = f"num_nodes={num_nodes} needs {num_nodes}", "num_nodes"
    return (
        f"{needs} {noun}s (one per node), but the cluster has {available}. {grow_hint}, or "
        f"lower {lower}."
    )


def check_reports(reports: list[ProbeReport], worker_noun: str, ship_hint: str) -> None:
    """Raise for the first worker that differs from the kernel or cannot run its share, in
    the engine's words (its ``worker_noun`` and ``ship_hint``)."""
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
