"""The launch, first-step and step-overhead benchmarks of two checkouts, in one interleaved run.

Run from the repository root::

    git worktree add ../base <commit>
    .venv/bin/python -m benchmarks.versions ../base [--rounds 3]

Each round runs every benchmark once per checkout, alternating which checkout goes first, each
from its own root (its package and its own benchmark code), with small settings:
``benchmarks.launch --quick --tools notebook_kit --only first,launch,failure``,
``benchmarks.first_step --rounds 1 --repeats 2 --tools notebook_kit`` and
``benchmarks.step_overhead --steps 60 --blocks 2``, and a cluster pool call (the median of
five ``run`` calls of a tiny function on ``WorkerPool(cluster=...)`` over a two-worker Dask
``LocalCluster``, the same script for both checkouts). Printed: the median over rounds of each
figure per checkout, and this checkout's ratio to the other (above 1: slower here). On a busy
machine only the ratio of figures measured in the same run means anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ("launch_first", "launch_repeat", "fail_time")
STEP_RATIO = re.compile(
    r"^(?P<label>[^:]+): .* ratio Accelerator/hand-written: wall (?P<wall>[\d.]+)"
)


# Written against the public API that both checkouts have, so it is run as it is in either.
CLUSTER_POOL_CALL = """
import json, statistics, time
from distributed import Client, LocalCluster
from notebook_kit import WorkerPool

def tiny():
    return 1

with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                  dashboard_address=None) as cluster, Client(cluster) as client:
    client.wait_for_workers(2)
    pool = WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False)
    try:
        pool.run(tiny)  # the first call ships the function: not timed
        times = []
        for _ in range(5):
            started = time.perf_counter()
            pool.run(tiny)
            times.append(time.perf_counter() - started)
    finally:
        pool.close()
print(json.dumps(statistics.median(times)))
"""


def _run(root: Path, module: str, *options: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = str(root)
    command = ["-c", module] if module == CLUSTER_POOL_CALL else ["-m", module, *options]
    done = subprocess.run(
        [sys.executable, *command],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module[:60]} in {root} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def _one_round(root: Path) -> dict[str, float]:
    """Every figure of one checkout, one run each."""
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as out:
        only = "first,launch,failure"
        _run(root, "benchmarks.launch", "--quick", "--tools", "notebook_kit", "--only", only,
             "--out", out)  # fmt: skip
        launch = json.loads((Path(out) / "launch.json").read_text())
        for name in LAUNCH:
            values = launch.get(name, {}).get("notebook_kit", {}).get("values") or []
            if values:
                figures[f"launch: {name} (s)"] = statistics.median(values)
        _run(root, "benchmarks.first_step", "--rounds", "1", "--repeats", "2",
             "--tools", "notebook_kit", "--out", out)  # fmt: skip
        first = json.loads((Path(out) / "first_step.json").read_text())["notebook_kit"]
        for name, value in first.items():
            if isinstance(value, float):
                figures[f"first_step: {name} (s)"] = value
    for line in _run(
        root, "benchmarks.step_overhead", "--steps", "60", "--blocks", "2"
    ).splitlines():
        if match := STEP_RATIO.match(line):
            figures[f"step_overhead: {match['label']} (ratio)"] = float(match["wall"])
    call = json.loads(_run(root, CLUSTER_POOL_CALL).strip().splitlines()[-1])
    figures["cluster pool: run of a tiny function (s)"] = call
    return figures


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("other", type=Path, help="the other checkout's root")
    cli.add_argument("--rounds", type=int, default=3)
    arguments = cli.parse_args()
    roots = {"this": ROOT, "other": arguments.other.resolve()}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in roots}
    for round_index in range(arguments.rounds):
        order = list(roots) if round_index % 2 == 0 else list(reversed(roots))
        for name in order:
            for key, value in _one_round(roots[name]).items():
                samples[name].setdefault(key, []).append(value)
    lines = [
        f"| figure | this checkout | {arguments.other} | ratio |",
        "|---|---|---|---|",
    ]
    for key in samples["this"]:
        mine = statistics.median(samples["this"][key])
        theirs = statistics.median(samples["other"].get(key) or [float("nan")])
        lines.append(f"| {key} | {mine:.3f} | {theirs:.3f} | {mine / theirs:.2f} |")
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print("\n".join(lines))
    print(f"\n{arguments.rounds} rounds; {os.cpu_count()} cores, load average {load} at the end.")


if __name__ == "__main__":
    main()
