"""``benchmarks.scale --engine ray`` at a tiny size (2 nodes x 2 simulated ranks on a local
Ray instance of 4 CPUs), and, on the same instance, the Ray engine's refusal of a run no Ray
node could ever hold. Timings are never asserted (the machine may be busy): what is checked is
that each figure is real."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # benchmarks/ is a folder of the repository, not installed
    sys.path.append(str(ROOT))  # after the package's own folder (tests.bite's broken copy)

from benchmarks._scale_run import Rates, measure_size  # noqa: E402
from tests.test_scale_benchmark import check_tiny_run  # noqa: E402

# Short bounds, as the Dask test's: a run that cannot end says so within seconds.
_RATES = Rates(seconds=1.0, fail_after=1.0, start_timeout=60.0, patience=10.0)


@pytest.fixture(scope="module")
def ray_scale() -> Iterator[Any]:
    """One Ray instance for the module: 4 CPUs, the simulated node in every worker process,
    none started ahead: the first launch starts its node tasks' processes itself."""
    from benchmarks._scale_cluster import RayScale

    made = RayScale(2, 2, start_workers=False)
    try:
        yield made
    finally:
        made.close()


@pytest.mark.integration
def test_on_ray_points_lines_stop_and_the_failure_are_all_measured_at_a_tiny_size(
    ray_scale: Any,
) -> None:
    processes = ray_scale.scheduler_processes()
    names = " ".join(" ".join(p.cmdline()) for p in processes)
    assert "gcs_server" in names and "raylet" in names  # this instance's own, counted
    tiny = measure_size("ray", processes, 4, 2, _RATES)
    check_tiny_run(tiny)  # through the hub and each node task's relay


@pytest.mark.integration
def test_a_run_no_ray_node_could_hold_is_refused_at_once_naming_the_fix(ray_scale: Any) -> None:
    """Two nodes of 4 ranks need 8 CPUs of a Ray node that has 4: refused before a placement
    group is asked for, not after ``rendezvous_timeout`` as if other work held the CPUs."""
    import ray
    from ray.util.placement_group import placement_group_table

    from benchmarks._scale_node import ScaleSpec, simulated_rank
    from notebook_kit import notebook_launcher
    from notebook_kit.launch.cluster.probing import ClusterSetupError

    groups = len(placement_group_table())
    spec = ScaleSpec("/nonexistent", 0.0)
    with pytest.raises(ClusterSetupError) as refused:
        notebook_launcher(
            simulated_rank, args=(spec,), cluster="ray", num_nodes=2, num_processes=4,
            live=False, rendezvous_timeout=5,
        )  # fmt: skip
    message = str(refused.value)
    assert "need 8 CPUs" in message and "has 4 in all" in message
    assert "num_processes" in message and "ray.init(num_cpus=...)" in message
    assert len(placement_group_table()) == groups  # none was asked for
    # The instance serves the next launch as before.
    assert ray.available_resources().get("CPU") == 4.0


def test_each_start_up_task_waits_in_the_hub_until_every_node_task_has_a_process() -> None:
    """A start-up task that returned at once would free its process for the next one, and Ray
    would start one process for all the node tasks instead of one each."""
    from notebook_kit.node.links.ray import RunHub

    async def arrive() -> None:
        hub = RunHub()
        hub.set_control("run", b"")
        first = asyncio.ensure_future(hub.worker_started("run", 2, 60.0))
        await asyncio.sleep(0.2)
        assert not first.done()  # it holds its process until the other has one
        await asyncio.wait_for(hub.worker_started("run", 2, 60.0), 10)
        await asyncio.wait_for(first, 10)
        waiting = asyncio.ensure_future(hub.worker_started("run", 3, 60.0))
        await asyncio.sleep(0.2)
        hub.forget("run")  # a run that ends meanwhile frees its start-up tasks
        await asyncio.wait_for(waiting, 10)
        await asyncio.wait_for(hub.worker_started("run", 2, 60.0), 10)  # and any later one

    asyncio.run(arrive())
