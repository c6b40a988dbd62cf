"""Deliberate breakages of pools on a cluster and the default %%distributed pool.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_REVIVES = (
    "tests/test_cluster_pool_kernel_integration.py::"
    "test_the_default_cluster_pool_starts_new_nodes_after_an_interrupt_or_a_lost_worker"
)
_DASHBOARD = (
    "tests/test_local_cluster_integration.py::"
    "test_the_dashboard_listens_on_loopback_only_and_none_means_no_http_at_all"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "default-pool-kept-closed",
        "a default %%distributed pool a fault closed starts new workers at its next cell",
        (
            Edit(
                "launch/magic.py",
                "            if not pool.closed:\n                return pool, False\n",
                "            if True:\n                return pool, False\n",
            ),
        ),
        (_REVIVES,),
    ),
    Mutation(
        "pool-restart-refuses-a-closed-pool",
        "restart() starts new workers for a closed pool, a cluster pool a fault closed included",
        (
            Edit(
                "launch/pool/worker_pool.py",
                "        self._check_process()\n        self._backend.check_start(",
                "        self._check_usable()\n        self._backend.check_start(",
            ),
        ),
        (
            "tests/test_pool_integration.py::test_close_collection_and_exit_leave_no_worker",
            _REVIVES,
        ),
    ),
    Mutation(
        "default-pool-unchecked-after-a-lost-node",
        "a node lost between cells closes the default pool, and its next cell starts new nodes",
        (
            Edit(
                "launch/magic.py",
                "                    pool.ensure_workers()\n",
                "                    pass\n",
            ),
        ),
        (_REVIVES,),
    ),
    Mutation(
        "cluster-option-replaces-the-default-pool",
        "%%distributed --cluster NAME without --num-nodes keeps the default pool and its nodes",
        (
            Edit(
                "launch/magic.py",
                "options.num_nodes in (None, nodes)",
                "options.num_nodes == nodes",
            ),
        ),
        (_REVIVES,),
    ),
    Mutation(
        "local-cluster-dashboard-on-every-interface",
        "local_cluster's dashboard listens on the loopback address only",
        (
            Edit(
                "launch/cluster/engines/dask_local.py",
                '    dashboard_address: str | None = "127.0.0.1:0",',
                '    dashboard_address: str | None = ":0",',
            ),
        ),
        (_DASHBOARD,),
    ),
    Mutation(
        "local-cluster-http-without-a-dashboard",
        "local_cluster(dashboard_address=None) leaves the scheduler serving no HTTP at all",
        (
            Edit(
                "launch/cluster/engines/dask_local.py",
                "            cluster.sync(_stop_http, cluster.scheduler)\n",
                "            pass\n",
            ),
        ),
        (_DASHBOARD,),
    ),
    Mutation(
        "pool-failure-interrupts-its-peers-at-once",
        "A failed rank's peers get a moment to answer by themselves: a rank failing the same "
        "way a moment later is named so, not cut short by the interrupt",
        (
            Edit(
                "launch/pool/workers.py",
                "_PEERS_GRACE_SECONDS = 0.2",
                "_PEERS_GRACE_SECONDS = 0.0",
            ),
        ),
        (
            "tests/test_pool_integration.py::"
            "test_a_peer_failing_a_moment_after_the_first_is_named_too_not_interrupted",
        ),
    ),
)
