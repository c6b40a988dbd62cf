"""A cluster run of many simulated ranks: what the kernel spends on them, from 8 to 512 ranks.

Run from the repository root::

    .venv/bin/python -m benchmarks.scale [--ranks 8 64 512] [--ranks-per-node 8]
        [--metrics-per-second 2] [--lines-per-second 1] [--seconds 10] [--engine dask|ray]

What is simulated: the ranks and the node process that would fork them. A simulated node
(``benchmarks/_scale_node.py``) is what the node task's zygote runs in place of the real node
process, on the same pipes: its ranks are threads without torch, each sending two metrics
batches (encoded by the workers' codec) and one output line a second and voting on Stop ten
times a second, and it sends them on through the real ``RelayObserver``. What is real: the
node task's relay (its batches, its heartbeat), the engine's link, the transport (the Dask
scheduler's events and variables, or Ray's hub), and the whole kernel side in this process
(``notebook_launcher(cluster=...)``, the attempt's loop, the quiet view's record, plot feed,
speed line, ranks' output and Stop).

Dask: a scheduler process and worker processes of ``--nodes-per-process`` Dask workers each,
made once for the largest size; a size of N ranks runs on N / ``--ranks-per-node`` of them.
Ray: a local instance with a logical CPU per simulated rank (a node task's bundle holds one
per rank) and a worker process started for each node of the largest size before the first.

For each size, two runs. The first: every rank sends for ``--seconds`` after every rank's
first point has arrived (and 2 s more); over that window, the kernel process's CPU (one core =
100%) and the scheduler's (Ray: its control store, raylet and the run's hub), the age of the
plot feed's newest point (95th percentile of a reading every 0.1 s; the median and the
largest in the table), and the kernel's resident-set growth from before the launch; then Stop
is pressed (the stop flag the Stop button sets) and the time to the last rank's seeing it is
read from the nodes. The second: the last rank raises a few seconds in; the time from its
raise to the kernel's ``WorkerError`` naming it.

Writes ``benchmarks/results/scale.md`` and ``scale.json`` (Ray: ``scale_ray.md`` and
``scale_ray.json``); the last line printed is the largest size's: ``scale N ranks: kernel
cpu X% · newest point Y s · stop Z s · failure named W s · kernel rss +R MiB``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import psutil

from benchmarks._scale_run import Rates, ScaleResult, measure_size

__all__ = ["check_arguments", "last_line", "main", "run"]

GOALS = {  # at 512 ranks, on a 2-core machine
    "kernel_cpu": 0.5,
    "newest_point": 1.0,
    "stop": 3.0,
    "failure_named": 2.0,
    "kernel_rss_growth": 300.0,
    "scheduler_cpu": 0.5,
}
# What one simulated node costs in memory, and one process of Dask workers (its zygote, which
# imported torch, included): measured at 64 nodes, with room to spare.
NODE_MIB = 60
PROCESS_MIB = 700
# Ray: a worker process per node task (Ray imported, no torch; about 115 MiB resident at 8
# nodes), and Ray's own processes once (its control store, raylet, agents, object store).
RAY_WORKER_MIB = 150
RAY_MIB = 1500
MAX_NODES_PER_PROCESS = 16  # threads of one worker process's event loop; more starve it


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        prog="python -m benchmarks.scale", description=__doc__.splitlines()[0]
    )
    cli.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512])
    cli.add_argument("--ranks-per-node", type=int, default=8)
    cli.add_argument("--nodes-per-process", type=int, default=8)
    cli.add_argument("--metrics-per-second", type=float, default=2.0)
    cli.add_argument("--lines-per-second", type=float, default=1.0)
    cli.add_argument("--seconds", type=float, default=10.0, help="the measured window")
    cli.add_argument("--engine", choices=("dask", "ray"), default="dask")
    cli.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    return cli


def check_arguments(arguments: argparse.Namespace) -> str:
    """What is wrong with the options, naming the option and the fix ("" when nothing)."""
    per_node = arguments.ranks_per_node
    if per_node <= 0:
        return f"--ranks-per-node must be at least 1 (got {per_node})."
    for ranks in arguments.ranks:
        if ranks <= 0:
            return f"--ranks must be positive numbers of ranks (got {ranks}): e.g. --ranks 8 64."
        if ranks % per_node:
            return (
                f"--ranks {ranks} is not a whole number of nodes of --ranks-per-node "
                f"{per_node}: pass a multiple of {per_node}."
            )
    for option in ("metrics_per_second", "lines_per_second", "seconds"):
        value = getattr(arguments, option)
        if not value > 0:
            return f"--{option.replace('_', '-')} must be more than 0 (got {value:g})."
    if not 1 <= arguments.nodes_per_process <= MAX_NODES_PER_PROCESS:
        return (
            f"--nodes-per-process must be from 1 to {MAX_NODES_PER_PROCESS} "
            f"(got {arguments.nodes_per_process})."
        )
    return _capacity(max(arguments.ranks) // per_node, arguments)


def _capacity(nodes: int, arguments: argparse.Namespace) -> str:
    """ "" when this machine can hold ``nodes`` simulated nodes, else why not."""
    if arguments.engine == "ray":  # one zygote, and a Ray worker process per node task
        fixed, each = RAY_MIB + PROCESS_MIB, RAY_WORKER_MIB + NODE_MIB
        what = f"{nodes} simulated nodes and a Ray worker process for each"
    else:  # processes of --nodes-per-process Dask workers, each with its zygote
        fixed, each = 0, PROCESS_MIB / arguments.nodes_per_process + NODE_MIB
        what = f"{nodes} simulated nodes"
    need = round(fixed + nodes * each)
    have = psutil.virtual_memory().available >> 20
    if need > have:
        most = max(int((have - fixed) / each), 0) * arguments.ranks_per_node
        return (
            f"--ranks {max(arguments.ranks)} needs {what}, about {need} MiB of memory, and "
            f"this machine has {have} MiB free: pass --ranks up to about {most}, or more "
            f"--ranks-per-node."
        )
    return ""


def run(arguments: argparse.Namespace) -> list[ScaleResult]:
    """Every size, smallest first, on one cluster made for the largest."""
    import torch  # noqa: F401  (a notebook's kernel has it: its memory is not the run's)

    from benchmarks._scale_cluster import DaskScale, RayScale
    from benchmarks._scale_run import warm_up

    logging.getLogger("distributed").setLevel(logging.WARNING)
    nodes = max(arguments.ranks) // arguments.ranks_per_node
    rates = Rates(arguments.metrics_per_second, arguments.lines_per_second, arguments.seconds)
    if arguments.engine == "ray":
        scale: DaskScale | RayScale = RayScale(nodes, arguments.ranks_per_node)
        print(f"Ray started a worker process for each of {nodes} nodes in {scale.started_in:.0f} s")
    else:
        folder = Path(tempfile.mkdtemp(prefix="nk_scale_cluster_"))
        scale = DaskScale(nodes, arguments.nodes_per_process, folder)
    try:
        warm_up(scale.cluster, scale.scheduler_processes(), arguments.ranks_per_node, rates)
        return [
            measure_size(
                scale.cluster, scale.scheduler_processes(), ranks, arguments.ranks_per_node, rates
            )
            for ranks in sorted(arguments.ranks)
        ]
    finally:
        scale.close()


def _figure(value: float | None, unit: str = " s") -> str:
    return "never" if value is None else f"{value:.2f}{unit}"


def last_line(result: ScaleResult) -> str:
    """The line the benchmark ends with (``never``: not every rank stopped, or the error did
    not name the failed rank)."""
    return (
        f"scale {result.ranks} ranks: kernel cpu {result.kernel_cpu * 100:.0f}% · newest point "
        f"{_figure(result.newest_point)} · stop {_figure(result.stop)} · failure named "
        f"{_figure(result.failure_named)} · kernel rss +{result.kernel_rss_growth:.0f} MiB"
    )


def _verdicts(result: ScaleResult) -> str:
    met = []
    for name, goal in GOALS.items():
        value = getattr(result, name)
        ok = value is not None and value <= goal
        met.append(f"{name.replace('_', ' ')} {'met' if ok else 'NOT met'}")
    return ", ".join(met)


def _table(results: list[ScaleResult]) -> str:
    lines = [
        "| ranks (nodes) | kernel cpu | scheduler cpu | newest point p95 (median, max) "
        "| stop | failure named (error raised) | kernel rss | points from / lines |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.ranks} ({r.nodes}) | {r.kernel_cpu * 100:.0f}% | {r.scheduler_cpu * 100:.0f}% "
            f"| {r.newest_point:.2f} s ({r.newest_point_median:.2f}, {r.newest_point_max:.2f}) "
            f"| {_figure(r.stop)} ({r.ranks_stopped}/{r.ranks} ranks) "
            f"| {_figure(r.failure_named)} ({_figure(r.failure_raised)}, "
            f"rank {r.failed_rank_named}) "
            f"| +{r.kernel_rss_growth:.0f} MiB | {r.ranks_seen} ranks / {r.lines_seen} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    cli = parser()
    arguments = cli.parse_args(argv)
    problem = check_arguments(arguments)
    if problem:
        cli.error(problem)
    load_before = os.getloadavg()
    results = run(arguments)
    largest = results[-1]
    text = (
        f"# {arguments.engine}: simulated ranks, {arguments.ranks_per_node} per node, "
        f"{arguments.metrics_per_second:g} metrics batches and {arguments.lines_per_second:g} "
        f"lines per rank per second, a {arguments.seconds:g} s window\n\n"
        f"Load average before: {' '.join(f'{x:.2f}' for x in load_before)}; after: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores.\n\n"
        f"{_table(results)}\n\nGoals at {largest.ranks} ranks: {_verdicts(largest)}.\n"
        + "".join(f"\n- {r.ranks} ranks: {note}" for r in results for note in r.notes)
    )
    arguments.out.mkdir(parents=True, exist_ok=True)
    name = "scale" if arguments.engine == "dask" else f"scale_{arguments.engine}"
    (arguments.out / f"{name}.md").write_text(text + "\n")
    (arguments.out / f"{name}.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    print(text)
    print(last_line(largest))


if __name__ == "__main__":
    main()
