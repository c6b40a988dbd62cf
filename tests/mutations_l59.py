"""Deliberate breakages of code that now serves where a second copy of it stood.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "cluster-failure-names-no-node",
        "a cluster failure names its rank's node and worker, as a pool's does",
        (
            Edit(
                "launch/cluster/failures.py",
                '        return f"Rank {rank} (node {node}, '
                '{self.worker_noun} {self.nodes[node]})"\n',
                '        return f"Rank {rank}"\n',
            ),
        ),
        (
            "tests/test_cluster.py::"
            "test_a_cluster_restart_is_announced_with_the_rank_and_node_or_the_lost_node",
        ),
    ),
    Mutation(
        "zygote-child-poll-reads-nothing",
        "a zygote child's poll reads its exit status, as its wait does",
        (Edit("node/zygote.py", "            self.wait(0.0)\n", "            pass\n"),),
        ("tests/test_zygote.py::test_poll_alone_reads_the_end_of_a_child",),
    ),
    Mutation(
        "cluster-desk-asks-nodes-as-ranks",
        "a cluster run's desk makes stacks requests its nodes answer, not its ranks",
        (
            Edit(
                "launch/cluster/cluster_stacks.py", "    stack_request = ClusterStackRequest\n", ""
            ),
        ),
        (
            "tests/test_stacks_cluster_integration.py::"
            "test_stacks_of_a_cluster_run_come_from_every_node_within_the_timeout",
        ),
    ),
)
