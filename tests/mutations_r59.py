"""Deliberate breakages of the Ray engine's placing of a run's node tasks, caught by
``tests/test_scale_benchmark_ray.py``: a run no Ray node could hold left pending until
``rendezvous_timeout``, and start-up tasks that free their process at once (so Ray starts one
process for every node task, which then wait for theirs and may be taken for lost nodes).

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_RAY_SCALE = "tests/test_scale_benchmark_ray.py::"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "ray-run-too-big-for-its-ray-node-left-pending",
        "A run whose bundles more than fill a Ray node is refused at once, naming the fix, "
        "not left pending until rendezvous_timeout as if other work held the CPUs",
        (
            Edit(
                "launch/cluster/engines/ray.py",
                "        check_room(shapes, nodes, workers)\n",
                "",
            ),
        ),
        (_RAY_SCALE + "test_a_run_no_ray_node_could_hold_is_refused_at_once_naming_the_fix",),
    ),
    Mutation(
        "ray-start-up-task-frees-its-process-at-once",
        "Each node task of a Ray run gets a worker process started before it is sent: the "
        "start-up tasks hold theirs until every one has one",
        (
            Edit(
                "node/links/ray.py",
                "            await asyncio.wait_for(state.workers_ready.wait(), wait)\n",
                "            pass\n",
            ),
        ),
        (
            _RAY_SCALE
            + "test_each_start_up_task_waits_in_the_hub_until_every_node_task_has_a_process",
        ),
    ),
)
