"""Deliberate breakages of pdb on a rank of a cluster node (its prompts asked in the kernel).

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_CLUSTER_PDB = "tests/test_debugger_cluster_kernel_integration.py::"
_QUIT = _CLUSTER_PDB + "test_q_on_a_node_ends_the_run_as_rank_1s_failure_and_the_next_launch_works"
_PRINT = _CLUSTER_PDB + "test_p_prints_rank_1s_variable_on_its_node_and_c_ends_the_run_normally"
_POOL = (
    _CLUSTER_PDB + "test_a_cluster_pool_command_opens_pdb_on_rank_1s_node_and_q_fails_the_command"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "node-writes-lines-to-ranks-not-at-a-prompt",
        "a node writes the kernel's line only to its own rank still at that prompt",
        (
            Edit(
                "launch/node_process/node_debugger.py",
                "            if line.rank in self.prompted:\n",
                "            if True:\n",
            ),
        ),
        ("tests/test_node_debugger.py::test_leaving_pdb_goes_home_and_a_dead_rank_gets_no_line",),
    ),
    Mutation(
        "node-asks-its-own-pdb-prompts",
        "a launch's rank at a breakpoint() on a cluster node prompts in the kernel's cell",
        (
            Edit(
                "launch/node_process/launch.py",
                "        supervisor.debugger = self.relay.debugger\n",
                "",
            ),
        ),
        (_QUIT,),
    ),
    Mutation(
        "pool-node-asks-its-own-pdb-prompts",
        "a cluster pool's rank at a breakpoint() prompts in the kernel's cell",
        (
            Edit(
                "launch/node_process/pooling.py",
                "    processes.supervisor.debugger = relay.debugger  #",
                "    #",
            ),
        ),
        (_POOL,),
    ),
    Mutation(
        "launch-nodes-hear-no-typed-line",
        "the line typed at a cluster rank's prompt reaches its node during a launch",
        (
            Edit(
                "node/task.py",
                "    link.listen(relay.commanded)\n",
                "    if order.pool:\n        link.listen(relay.commanded)\n",
            ),
        ),
        (_QUIT,),
    ),
    Mutation(
        "kernel-ignores-node-prompts",
        "the kernel asks a cluster rank's pdb prompt in the cell",
        (
            Edit(
                "launch/cluster/attempt.py",
                "            self.debugger.receive(event)\n",
                "            pass\n",
            ),
        ),
        (_QUIT,),
    ),
    Mutation(
        "cluster-prompt-time-counts-against-the-timeout",
        "the time at a cluster rank's pdb prompt is not the launch's timeout",
        (
            Edit(
                "launch/cluster/run.py",
                "started - attempt.debugged  #",
                "started  #",
            ),
        ),
        (_PRINT,),
    ),
)
