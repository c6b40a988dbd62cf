"""Deliberate breakages of the settings' one path: scopes, bound arguments, the worker environment.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "launch-arguments-lose-their-defaults",
        "a launcher's body gets every argument, the ones left out at their defaults",
        (Edit("config/arguments.py", "            bound.apply_defaults()\n", ""),),
        ("tests/test_schema.py::test_the_launcher_and_the_config_refuse_the_same_range",),
    ),
    Mutation(
        "cluster-sends-the-node-rank-it-decides",
        "a node_rank given to a cluster launch is refused: the kernel numbers the nodes",
        (
            Edit(
                "config/schema.py",
                'ceiling=MAX_NODES - 1, widget="count", scope=("cluster",),',
                'ceiling=MAX_NODES - 1, widget="count", scope=("node",),',
            ),
        ),
        (
            "tests/test_cluster.py::"
            "test_each_setting_given_to_a_cluster_launch_is_honoured_or_refused_before_start",
        ),
    ),
    Mutation(
        "script-workers-miss-gradient-accumulation",
        "notebook-kit launch gives its workers every setting their Accelerator reads",
        (
            Edit(
                "config/schema.py",
                'ceiling=4096, widget="count", scope=("node", "worker"),',
                'ceiling=4096, widget="count", scope=("node",),',
            ),
        ),
        (
            "tests/test_script_launch.py::"
            "test_single_node_uses_a_free_port_and_the_notebook_environment",
        ),
    ),
    Mutation(
        "plan-takes-the-config-over-the-machine",
        "what the machine decides (processes, loopback address) wins over the config's auto",
        (
            Edit(
                "launch/plan.py",
                "LaunchPlan(**{**as_given, **decided})",
                "LaunchPlan(**{**decided, **as_given})",
            ),
        ),
        ("tests/test_arguments.py::test_single_node_always_uses_loopback",),
    ),
)
