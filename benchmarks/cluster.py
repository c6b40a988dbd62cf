"""A cluster run against a local launch: time to the first step, and the time of each step.

Run from the repository root::

    .venv/bin/python -m benchmarks.cluster [--rounds 3] [--steps 60]

Each round, in the same process and interleaved, launches the same DDP training function
(a small CNN, batch 32, SGD, one thread per rank) these ways, in this order:

- ``ray train``: Ray Train's ``TorchTrainer`` with 2 CPU workers on a local Ray instance
  (``ray.init(num_cpus=2)``, started once, before the rounds), where ray is installed;
- ``ray after a Ray Train fit``: ``notebook_launcher(cluster="ray", num_nodes=2,
  num_processes=1)`` on that Ray instance, right after the fit: Ray Train's actors took over
  the idle Ray worker processes of the same Ray job, so Ray starts new ones for the nodes;
- ``ray``: the same launch again, as a cell run a second time;
- ``local fork``: ``notebook_launcher(num_processes=2)``, the baseline;
- ``cluster``: ``notebook_launcher(cluster=client, num_nodes=2, num_processes=1)`` on a
  ``LocalCluster`` of 2 worker processes (made once, before the rounds).

The baseline runs right after ``ray`` and right before ``cluster``, so each is compared with
a launch made within a second of it, whatever else the machine runs meanwhile. Before the
rounds, each cluster way's first launch (untimed for Dask; for Ray reported apart) starts what
later launches reuse: the workers' zygotes, Ray's hub and keeper actors.

Reported per way, as the median over rounds: seconds from the call to the first optimizer
step done on every rank, and the median step time after the first five steps. Its ratio to
the local fork launch is the median over rounds of each round's ratio (the goal for the
cluster and ray: at most 1.05x; for ray's first step also: at most a tenth of Ray Train's).
Each round's figures are in ``cluster.json``.

Then the warm pools: a ``WorkerPool(cluster=client, num_nodes=2, num_processes=1)`` against a
local ``WorkerPool(num_processes=2)``, interleaved call by call: a trivial ``pool.run`` (from
the call to its value; goal for the cluster: at most 50 ms) and a ``%%distributed`` cell that
prints a line (``pool.run_cell``, what the magic runs; from the call to the line printed in
the kernel and the cell's end). Medians over ``--calls`` calls each.

Writes ``benchmarks/results/cluster.md`` and ``cluster.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

WARMUP_STEPS = 5
STEP_GOAL = 1.05
RAY_FIRST_STEP_GOAL = 0.1  # our Ray launch's first step against Ray Train's
RAY_AFTER_TRAIN = "ray after a Ray Train fit"
POOL_CALL_GOAL = 0.050  # seconds: a trivial pool.run on the cluster, call to value


def train(run_dir: str, steps: int) -> None:
    """The workload: one rank's steps; writes when its first step was done and its step times.

    Defined in ``__main__`` when run as a module, so cloudpickle sends it by value and the
    nodes need nothing of this repository but notebook_kit itself.
    """
    import os
    import time

    import torch
    import torch.distributed as dist
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 14 * 14, 10),
    )  # fmt: skip
    model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images, labels = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    rank, times = dist.get_rank(), []
    for step in range(steps):
        started = time.perf_counter()
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - started)
        if step == 0:
            Path(os.path.join(run_dir, f"stepped-{rank}")).write_text(repr(time.time()))
    Path(os.path.join(run_dir, f"steps-{rank}")).write_text(json.dumps(times))


def fail_on_node_1(run_dir: str) -> None:
    """Rank 1 raises; rank 0 sleeps (no collective), so only the kernel's abort ends it."""
    import os
    import time

    import torch.distributed as dist

    if dist.get_rank() == 1:
        Path(os.path.join(run_dir, "raised")).write_text(repr(time.time()))
        raise RuntimeError("benchmark failure on node 1")
    time.sleep(120)


def spin(run_dir: str) -> None:
    """Every rank runs until it is stopped from outside."""
    import os
    import time

    import torch.distributed as dist

    Path(os.path.join(run_dir, f"running-{dist.get_rank()}")).touch()
    while True:
        time.sleep(0.01)


def _faults(client: Any) -> dict[str, float]:
    """Seconds from a rank raising on node 1 to the error in the kernel, and from Ctrl-C to
    the KeyboardInterrupt (that every node is then gone is what the tests check)."""
    import os
    import threading

    from notebook_kit import notebook_launcher
    from notebook_kit.errors import WorkerError

    run_dir = Path(tempfile.mkdtemp(prefix="nk_bench_fault_"))
    options = {"cluster": client, "num_nodes": 2, "num_processes": 1, "live": False}
    try:
        notebook_launcher(fail_on_node_1, args=(str(run_dir),), **options)
    except WorkerError:
        failed = time.time() - float((run_dir / "raised").read_text())
    pressed: list[float] = []

    def press() -> None:
        while not all((run_dir / f"running-{r}").exists() for r in (0, 1)):
            time.sleep(0.02)
        pressed.append(time.time())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press, daemon=True).start()
    try:
        notebook_launcher(spin, args=(str(run_dir),), **options)
    except KeyboardInterrupt:
        interrupted = time.time() - pressed[0]
    return {"failure to error": failed, "Ctrl-C to KeyboardInterrupt": interrupted}


def _read(run_dir: Path, started: float) -> dict[str, float]:
    stepped = max(float((run_dir / f"stepped-{rank}").read_text()) for rank in (0, 1))
    times = [t for rank in (0, 1) for t in json.loads((run_dir / f"steps-{rank}").read_text())]
    return {"first step": stepped - started, "step": statistics.median(times[WARMUP_STEPS:])}


def _cluster(client: Any, steps: int) -> dict[str, float]:
    from notebook_kit import notebook_launcher

    run_dir = Path(tempfile.mkdtemp(prefix="nk_bench_cluster_"))
    started = time.time()
    notebook_launcher(
        train, args=(str(run_dir), steps), cluster=client, num_nodes=2, num_processes=1,
        threads_per_process=1, live=False,
    )  # fmt: skip
    return _read(run_dir, started)


def _local(steps: int) -> dict[str, float]:
    from notebook_kit import notebook_launcher

    run_dir = Path(tempfile.mkdtemp(prefix="nk_bench_local_"))
    started = time.time()
    notebook_launcher(
        train, args=(str(run_dir), steps), num_processes=2, threads_per_process=1, live=False
    )
    return _read(run_dir, started)


def _our_ray(steps: int) -> dict[str, float]:
    """Our launch on the local Ray instance: 2 nodes of 1 rank."""
    from notebook_kit import notebook_launcher

    run_dir = Path(tempfile.mkdtemp(prefix="nk_bench_our_ray_"))
    started = time.time()
    notebook_launcher(
        train, args=(str(run_dir), steps), cluster="ray", num_nodes=2, num_processes=1,
        threads_per_process=1, live=False,
    )  # fmt: skip
    return _read(run_dir, started)


def _ray(steps: int) -> dict[str, float]:
    """Ray Train's TorchTrainer with 2 CPU workers (its own process group, gloo)."""
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    run_dir = Path(tempfile.mkdtemp(prefix="nk_bench_ray_"))
    started = time.time()
    trainer = TorchTrainer(
        lambda config: train(config["run_dir"], config["steps"]),
        train_loop_config={"run_dir": str(run_dir), "steps": steps},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
    )
    handler = signal.getsignal(signal.SIGINT)
    try:
        trainer.fit()
    finally:  # Ray puts its own SIGINT handler in place; Ctrl-C must reach the next launch
        signal.signal(signal.SIGINT, handler)
    return _read(run_dir, started)


def nothing() -> int:
    """The trivial pool call."""
    return 1


def _pool_latency(client: Any, calls: int) -> dict[str, dict[str, float]]:
    """Median seconds of a trivial run and of a printing cell, cluster pool and local pool."""
    import contextlib
    import io

    from notebook_kit import WorkerPool

    pools = {
        "cluster pool": WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False),
        "local pool": WorkerPool(num_processes=2, live=False),
    }
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in pools}
    try:
        for _ in range(3):  # first calls warm caches: not timed
            for pool in pools.values():
                pool.run(nothing)
        for _ in range(calls):
            for name, pool in pools.items():
                started = time.perf_counter()
                pool.run(nothing)
                samples[name].setdefault("run", []).append(time.perf_counter() - started)
                printed = io.StringIO()
                started = time.perf_counter()
                with contextlib.redirect_stdout(printed):
                    pool.run_cell("print('a line from every rank')")
                samples[name].setdefault("cell", []).append(time.perf_counter() - started)
                assert printed.getvalue().count("a line from every rank") == 2
    finally:
        for pool in pools.values():
            pool.close()
    return {
        name: {metric: statistics.median(values) for metric, values in rows.items()}
        for name, rows in samples.items()
    }


def measure(rounds: int, steps: int, calls: int = 30) -> dict[str, dict[str, Any]]:
    """Medians over ``rounds`` of each way, interleaved in this one process."""
    from distributed import Client, LocalCluster

    ways: dict[str, Any] = {"local fork": _local}
    notes: dict[str, str] = {}
    first_launches: dict[str, dict[str, float]] = {}
    if importlib.util.find_spec("ray") is None:
        notes["ray train"] = "ray is not installed (pip install 'notebook_kit[bench]')"
    else:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        # The kernel's first launch on the Ray instance starts its hub, its keeper (and the
        # keeper's zygote, which imports torch) and the node tasks' Ray worker processes.
        first_launches["ray"] = _our_ray(WARMUP_STEPS + 1)
        ways = {
            "ray train": _ray,
            RAY_AFTER_TRAIN: _our_ray,  # Ray Train's actors took the idle Ray workers
            "ray": _our_ray,  # the next launch, as a cell run again
            **ways,
        }
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        ways["cluster"] = lambda s: _cluster(client, s)
        samples: dict[str, dict[str, list[float]]] = {way: {} for way in ways}
        _cluster(client, WARMUP_STEPS + 1)  # the workers' first import of torch: not timed
        faults: dict[str, list[float]] = {}
        for _ in range(rounds):
            for name, run in ways.items():
                for metric, value in run(steps).items():
                    samples[name].setdefault(metric, []).append(value)
            for metric, value in _faults(client).items():
                faults.setdefault(metric, []).append(value)
        pools = _pool_latency(client, calls)
    if "ray train" in ways:
        import ray

        ray.shutdown()
    base = samples["local fork"]["step"]
    results: dict[str, dict[str, Any]] = {}
    for name, rows in samples.items():
        ratios = [step / local for step, local in zip(rows["step"], base, strict=True)]
        results[name] = {metric: statistics.median(values) for metric, values in rows.items()}
        results[name]["step vs local"] = statistics.median(ratios)
        results[name]["rounds"] = {**rows, "step vs local": ratios}
    for name, why in notes.items():
        results[name] = {"note": why}
    results["faults"] = {metric: max(values) for metric, values in faults.items()}
    results["pools"] = pools
    results["first launches"] = first_launches
    return results


def _table(results: dict[str, dict[str, Any]]) -> str:
    base = results["local fork"]
    lines = [
        "| launch | call to first step on every rank | step time (median) | step vs local |",
        "|---|---|---|---|",
    ]
    for name, row in results.items():
        if name in ("faults", "pools", "first launches"):
            continue
        if "note" in row:
            lines.append(f"| {name} | {row['note']} | | |")
            continue
        first = f"{row['first step']:.2f} s (x{row['first step'] / base['first step']:.2f})"
        ratio = row["step vs local"]
        lines.append(f"| {name} | {first} | {row['step'] * 1e3:.2f} ms | x{ratio:.3f} |")
    return "\n".join(lines)


def _pool_table(pools: dict[str, dict[str, float]]) -> str:
    base = pools["local pool"]
    lines = [
        "| warm pool | trivial `pool.run`, call to value | `%%distributed` cell printing a line |",
        "|---|---|---|",
    ]
    for name, row in pools.items():
        run = f"{row['run'] * 1e3:.1f} ms (x{row['run'] / base['run']:.0f})"
        cell = f"{row['cell'] * 1e3:.1f} ms (x{row['cell'] / base['cell']:.0f})"
        lines.append(f"| {name} | {run} | {cell} |")
    return "\n".join(lines)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--rounds", type=int, default=5)
    cli.add_argument("--steps", type=int, default=60)
    cli.add_argument("--calls", type=int, default=30, help="timed calls of each pool command")
    cli.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    arguments = cli.parse_args()
    from benchmarks._report import machine_description

    load_before = _load()
    results = measure(arguments.rounds, arguments.steps, arguments.calls)
    ratio = results["cluster"]["step vs local"]
    verdict = "met" if ratio <= STEP_GOAL else "not met"
    ray_goals = ""
    if "first step" in results.get("ray", {}) and "first step" in results["ray train"]:
        train = results["ray train"]["first step"]
        first = results["ray"]["first step"] / train
        step = results["ray"]["step vs local"]
        after = results[RAY_AFTER_TRAIN]["first step"] / train
        cold = results["first launches"]["ray"]["first step"] / train
        ray_goals = (
            f' Ray (our launch with cluster="ray", following our previous one): first step at '
            f"most 1/10 of Ray Train's: {'met' if first <= RAY_FIRST_STEP_GOAL else 'not met'} "
            f"(x{first:.3f}); step time x{STEP_GOAL}: "
            f"{'met' if step <= STEP_GOAL else 'not met'} (x{step:.3f}). Our launch right after "
            f"a Ray Train fit in the same Ray job: x{after:.3f} of Ray Train's first step; the "
            f"kernel's first launch on the Ray instance (one, before the rounds): x{cold:.3f}."
        )
    call = results["pools"]["cluster pool"]["run"]
    call_verdict = "met" if call <= POOL_CALL_GOAL else "not met"
    header = (
        "# A 2-node Dask LocalCluster and a 2-node local Ray instance against a local "
        "2-process fork launch\n\n"
        f"Small CNN with DDP, batch 32, one thread per rank, {arguments.steps} steps, median "
        f"of {arguments.rounds} interleaved rounds; step ratios are the median of each round's "
        f"against the local fork launch of the same round. Step-time goal x{STEP_GOAL}: "
        f"{verdict} (x{ratio:.3f})."
        f"{ray_goals}\n\n"
        f"Command: `python -m benchmarks.cluster --rounds {arguments.rounds} --steps "
        f"{arguments.steps} --calls {arguments.calls}`. "
        f"Machine: {machine_description(load_before, _load())}\n\n"
    )
    arguments.out.mkdir(parents=True, exist_ok=True)
    faults = "\n\nEndings on the cluster, slowest of the rounds: " + ", ".join(
        f"{metric} {value:.2f} s" for metric, value in results["faults"].items()
    )
    pools = (
        f"\n\nWarm pools, median of {arguments.calls} interleaved calls each (ratios against the "
        f"local pool). Goal for a trivial cluster `pool.run`: at most "
        f"{POOL_CALL_GOAL * 1e3:.0f} ms, {call_verdict} ({call * 1e3:.1f} ms).\n\n"
        + _pool_table(results["pools"])
    )
    text = header + _table(results) + faults + pools + "\n"
    (arguments.out / "cluster.md").write_text(text)
    (arguments.out / "cluster.json").write_text(json.dumps(results, indent=2))
    print(text)


def _load() -> tuple[float, ...]:
    import os

    return os.getloadavg()


if __name__ == "__main__":
    main()
