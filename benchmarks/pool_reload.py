"""An edited module on a warm pool: the time from the edit to the answer that shows the new code.

Part of ``benchmarks.pool`` (``--reload-runs``; ``--reload-only`` runs this part alone). On a
2-process local pool and on a 2-node Dask ``LocalCluster`` pool (1 rank each), each round
times the same cell (``m.f()`` on every rank) three times: with nothing edited and
``reload="off"`` (what the check itself costs), with nothing edited (the baseline: what any
cell costs), then right after rewriting the module's file, every rank answering with the new
value. The ratio is edited over unedited, medians of the same run; the goal is
the edited cell within 1 s.
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL_SECONDS = 1.0
MODULE = "nk_bench_reload"


def _write(path: Path, value: int) -> None:
    """The module's new text, its mtime moved on (a coarse file system could miss the edit)."""
    before = path.stat().st_mtime if path.exists() else time.time() - 10
    path.write_text(f"def f():\n    return {value}\n")
    os.utime(path, (before + 1, before + 1))


def _rounds(pool: Any, path: Path, runs: int) -> dict[str, list[float]]:
    """Unedited and edited cell times on ``pool``, alternating, ``runs`` of each."""
    pool.run_cell(f"import {MODULE} as m")
    plain: list[float] = []
    edited: list[float] = []
    off: list[float] = []  # the unedited cell without the check: what the check itself costs
    for value in range(1, runs + 1):
        started = time.perf_counter()
        pool.run_cell("m.f()", every=True, reload="off")
        off.append(time.perf_counter() - started)
        started = time.perf_counter()
        pool.run_cell("m.f()", every=True)
        plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        _write(path, value)
        seen = pool.run_cell("m.f()", every=True)
        edited.append(time.perf_counter() - started)
        assert set(seen.values()) == {value}, f"the ranks answered {seen}, not {value}"
    return {"plain": plain, "edited": edited, "off": off}


def reload_part(runs: int) -> dict[str, dict[str, list[float]]]:
    """Both pools' figures: ``{"local": {...}, "cluster": {...}}`` (cluster: when Dask is)."""
    from notebook_kit import WorkerPool

    folder = Path(tempfile.mkdtemp(prefix="nk-bench-reload-"))
    path = folder / f"{MODULE}.py"
    _write(path, 0)
    sys.path.insert(0, str(folder))  # before the Dask workers start: their nodes import it too
    importlib.import_module(MODULE)  # the kernel's copy: what a cluster pool ships from
    figures: dict[str, dict[str, list[float]]] = {}
    with WorkerPool(num_processes=2, live=False, reload="auto") as pool:
        figures["local"] = _rounds(pool, path, runs)
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        return figures
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        pool = WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False)
        try:
            figures["cluster"] = _rounds(pool, path, runs)
        finally:
            pool.close()
    return figures


def reload_report(figures: dict[str, dict[str, list[float]]]) -> str:
    """A table: the unedited and edited cell, their ratio, and the edited one against 1 s."""
    lines = [
        "",
        f"| edited module reaches the ranks | unedited, reload off | unedited cell | edited cell "
        f"| ratio | <= {GOAL_SECONDS:g} s |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in (("local", "2 local ranks"), ("cluster", "2-node LocalCluster")):
        if key not in figures:
            continue
        off = statistics.median(figures[key]["off"])
        plain = statistics.median(figures[key]["plain"])
        edited = statistics.median(figures[key]["edited"])
        verdict = "yes" if edited <= GOAL_SECONDS else "no"
        lines.append(
            f"| {label} | {off * 1000:.1f} ms | {plain * 1000:.1f} ms | {edited * 1000:.1f} ms | "
            f"{edited / plain:.2f}x | {verdict} ({edited:.3f} s) |"
        )
    return "\n".join(lines)
