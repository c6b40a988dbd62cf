"""Deliberate breakages of the engines as plug-ins: the lazy table, the neutral choice, the
node process's own plan.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "engine-table-imports-ray",
        "the engine table tells the engines apart without importing any of them",
        (
            Edit(
                "launch/cluster/engines/__init__.py",
                "        takes=lambda value: isinstance(value, str),\n",
                '        takes=lambda value: isinstance(value, str) and bool(__import__("ray")),\n',
            ),
        ),
        ("tests/test_schema.py::test_every_engine_of_the_table_is_lazy_and_has_both_sides",),
    ),
    Mutation(
        "engine-chooses-an-excluded-worker",
        "an engine never chooses a worker it was told to leave out (a lost one)",
        (
            Edit(
                "launch/cluster/engine.py",
                "usable = {a: info for a, info in self.workers().items() if a not in exclude}",
                "usable = dict(self.workers())",
            ),
        ),
        (
            "tests/test_cluster_checks.py::test_an_engine_chooses_among_its_workers_in_its_own_words",
        ),
    ),
    Mutation(
        "node-plan-misses-node-0s-port",
        "a node's plan meets at the port node 0 bound, not one from its config",
        (Edit("launch/node_process/process.py", "        master_port=master.port,\n", ""),),
        ("tests/test_cluster.py::test_a_node_plans_from_its_typed_settings_and_node_0s_address",),
    ),
    Mutation(
        "node-plan-restarts-on-its-own",
        "a node never restarts its ranks itself: the kernel restarts every node together",
        (
            Edit(
                "launch/node_process/process.py",
                "        max_restarts=0,",
                "        max_restarts=3,",
            ),
        ),
        ("tests/test_cluster.py::test_a_node_plans_from_its_typed_settings_and_node_0s_address",),
    ),
)
