"""The clusters ``benchmarks.scale`` drives: a Dask scheduler and light workers, or Ray.

Dask: the scheduler runs in a process of its own (so its CPU share is measured apart from the
kernel's), and each worker process runs several Dask ``Worker`` objects on one event loop,
each a worker of its own address, so a handful of processes play 64 nodes. Ray: a local
instance whose worker processes start with the same setup. Either way, each worker process
sets :data:`notebook_kit.node.task.NODE_PROCESS_MAIN` to the simulated node before any node
task runs, and nothing else of the node task, the links or the kernel changes.

Run as ``python -m benchmarks._scale_cluster scheduler FILE`` or ``... workers ADDRESS COUNT``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

__all__ = ["DaskScale", "RayScale", "simulate_nodes"]

SIMULATED_NODE = "benchmarks._scale_node:main"
# Not resolved: under tests.bite this folder is a link beside a broken copy of the package.
_REPO = str(Path(__file__).absolute().parent.parent)
_START_SECONDS = 120.0
_OBJECT_STORE_BYTES = 200 << 20


def simulate_nodes() -> None:
    """In a worker process: its node tasks start the simulated node instead of a real one.

    Ray calls it as the ``worker_process_setup_hook`` of every worker process it starts.
    """
    import notebook_kit.node.task as task

    task.NODE_PROCESS_MAIN = SIMULATED_NODE


def _environment() -> dict[str, str]:
    """This environment, with the repository first on the path (the node processes import
    ``benchmarks._scale_node`` by name) and Dask's logging at warnings."""
    import notebook_kit

    env = dict(os.environ)
    package = str(Path(notebook_kit.__file__).parent.parent)  # the one this process runs
    folders = (package, _REPO, env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in folders if p)
    env["DASK_LOGGING__DISTRIBUTED"] = "warning"  # one line per task and variable otherwise
    return env


class DaskScale:
    """A scheduler process and ``processes`` worker processes of ``per_process`` workers."""

    def __init__(self, workers: int, per_process: int, folder: Path) -> None:
        self.folder, self.children = folder, []
        address_file = folder / "scheduler-address"
        self.scheduler = self._spawn("scheduler", str(address_file))
        deadline = time.monotonic() + _START_SECONDS
        while not address_file.exists() or not address_file.read_text():
            self._check_started(deadline)
            time.sleep(0.1)
        self.address = address_file.read_text()
        for start in range(0, workers, per_process):
            self._spawn("workers", self.address, str(min(per_process, workers - start)))
        from distributed import Client

        self.client = Client(self.address, timeout=_START_SECONDS)
        self.client.wait_for_workers(workers, timeout=_START_SECONDS)

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._scale_cluster", *args], env=_environment()
        )
        self.children.append(child)
        return child

    def _check_started(self, deadline: float) -> None:
        if self.scheduler.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the Dask scheduler of benchmarks.scale did not start")

    @property
    def cluster(self) -> Any:
        return self.client

    def scheduler_processes(self) -> list[psutil.Process]:
        return [psutil.Process(self.scheduler.pid)]

    def close(self) -> None:
        """The workers first (they would try to reach a scheduler gone), then the scheduler."""
        self.client.close()
        for group in (self.children[1:], self.children[:1]):
            for child in group:
                child.terminate()
            for child in group:
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()


class RayScale:
    """A local Ray instance whose worker processes run simulated nodes."""

    def __init__(self, workers: int, ranks_per_node: int, start_workers: bool = True) -> None:
        """``start_workers``: start a Ray worker process for each node before any run (else
        the first launch's own start does, as on a fresh Ray cluster)."""
        import ray

        from notebook_kit.launch.cluster.engines import ray_actors

        # A fresh instance: actors this process made on an earlier one are not there.
        ray_actors._actors.clear()
        ray_actors._deaths.clear()
        os.environ["PYTHONPATH"] = _environment()["PYTHONPATH"]
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(
            address="local",  # its own instance, never another one running on this machine
            # A node task's bundle holds a CPU per rank: as many logical CPUs as ranks, or the
            # run's placement group is never ready.
            num_cpus=workers * ranks_per_node,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=_OBJECT_STORE_BYTES,  # the runs put only small objects there
            _system_config={
                "enable_worker_prestart": False,  # its own start, below
                # Kept between sizes: Ray ends idle worker processes after a second (61 of
                # 64 were gone by the next size), and each launch then started them again.
                "idle_worker_killing_time_threshold_ms": 3_600_000,
            },
            runtime_env={
                "worker_process_setup_hook": "benchmarks._scale_cluster.simulate_nodes",
                "env_vars": {"PYTHONPATH": _environment()["PYTHONPATH"]},
            },
        )
        self.cluster = "ray"
        self.started_in = _start_ray_workers(workers, ranks_per_node) if start_workers else 0.0

    def scheduler_processes(self) -> list[psutil.Process]:
        """Ray's own processes: its control store, raylet, and the run's hub actor. Only this
        instance's (this process started them): another Ray on the machine is not counted."""
        names = ("gcs_server", "raylet", "RunHub")
        found = []
        for process in psutil.Process().children(recursive=True):
            try:
                text = " ".join(process.cmdline() or [process.name()])
            except psutil.Error:
                continue
            if any(name in text for name in names):
                found.append(process)
        return found

    def close(self) -> None:
        import ray

        ray.shutdown()


def _start_ray_workers(count: int, ranks_per_node: int) -> float:
    """Start a Ray worker process for each node task before any run, as the Dask workers
    are started before any run, so that no size's launch waits for Ray to start processes
    (on 2 busy cores, several seconds each, two at a time); the seconds it took.

    Each start-up task holds its process in the kernel's hub until all have one (what a
    run's own start does per launch), so that Ray starts ``count`` processes, not one."""
    import ray

    from notebook_kit.launch.cluster.engines.ray_actors import kernel_hub, remote_once
    from notebook_kit.node.links.ray import worker_started

    started, hub, run = time.monotonic(), kernel_hub(), "benchmarks.scale-workers"
    ray.get(hub.set_control.remote(run, b""))
    task = remote_once(worker_started).options(num_cpus=ranks_per_node)
    wait = 60.0 + 10.0 * count  # Ray starts worker processes a few at a time
    ray.get([task.remote(hub, run, count, wait) for _ in range(count)], timeout=wait + 10)
    ray.get(hub.forget.remote(run))
    return time.monotonic() - started


async def _serve_workers(address: str, count: int) -> None:
    from distributed import Worker

    workers = [
        Worker(address, nthreads=1, host="127.0.0.1", dashboard=False, memory_limit=0)
        for _ in range(count)
    ]
    await asyncio.gather(*workers)
    await asyncio.gather(*(worker.finished() for worker in workers))


async def _serve_scheduler(address_file: str) -> None:
    from distributed import Scheduler

    scheduler = Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0")
    await scheduler
    Path(address_file).write_text(scheduler.address)
    await scheduler.finished()


def _main(argv: list[str]) -> None:
    if argv[0] == "scheduler":
        asyncio.run(_serve_scheduler(argv[1]))
    else:
        simulate_nodes()
        asyncio.run(_serve_workers(argv[1], int(argv[2])))


if __name__ == "__main__":
    _main(sys.argv[1:])
