"""Deliberate breakages of parallelism checks, resumes and weights.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_PARALLEL = "tests/test_parallelism_integration.py::"
_REFUSED_BEFORE_START = (
    _PARALLEL + "test_launch_settings_that_cannot_be_laid_out_are_refused_before_anything_starts"
)
_LAUNCH_RULES = (
    "tests/test_parallelism.py::"
    "test_the_launch_refuses_replicas_alone_and_context_parallel_on_cpu_ranks"
)
_TP_PLAIN = (
    _PARALLEL
    + "test_a_plain_model_splits_by_the_users_plan_from_launch_settings_and_failures_name_the_mesh"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "tp-plan-unknown-keys-skipped",
        "a tp_plan key naming no module is refused, rather than leaving a layer whole",
        (
            Edit(
                "accelerator/strategies/tensor_parallel.py",
                "    unmatched = [key for key in plan if not any(_matches(key, name) for name in "
                "names)]\n",
                "    unmatched: list[str] = []\n",
            ),
        ),
        (_TP_PLAIN,),
    ),
    Mutation(
        "resume-rng-all-from-rank-0",
        "resumed on another world size, each rank gets its own saved RNG states back",
        (
            Edit(
                "accelerator/checkpointing.py",
                "    if not same and rank != 0:\n",
                "    if not same and rank < 0:\n",
            ),
        ),
        (
            "tests/test_resume_world_size_integration.py::"
            "test_on_another_world_size_each_rank_gets_its_own_rng_states_back",
        ),
    ),
    Mutation(
        "gathered-weights-deduplicated-by-address",
        "sharded weights come home each tensor its own, though gathered ones reuse an address",
        (
            Edit(
                "runtime/weights_file.py",
                "stored[kernel_id] = writer.state(items, tied=not gathered)",
                "stored[kernel_id] = writer.state(items, tied=True)",
            ),
        ),
        (
            "tests/test_fsdp_weights_home_integration.py::"
            "test_the_weights_of_many_same_shape_layers_come_home_each_its_own",
        ),
    ),
    Mutation(
        "launch-replicas-alone-start-the-ranks",
        "parallelism_config_dp_replicate_size alone (DDP) is refused before any rank starts",
        (Edit("launch/plan.py", "    _refuse_replicas_alone(sizes)\n", ""),),
        (_LAUNCH_RULES, _REFUSED_BEFORE_START),
    ),
    Mutation(
        "launch-context-parallel-on-cpu-starts-the-ranks",
        "parallelism_config_cp_size on CPU ranks is refused before any rank starts",
        (
            Edit(
                "launch/plan.py",
                '    if sizes["cp"] > 1 and device is not None and device != "cuda":\n',
                '    if sizes["cp"] > 1 and device == "tpu":\n',
            ),
        ),
        (_LAUNCH_RULES, _REFUSED_BEFORE_START),
    ),
    Mutation(
        "cluster-mesh-left-to-the-nodes",
        "a mesh the probed nodes cannot hold is refused in the kernel before any node starts",
        (
            Edit(
                "launch/cluster/run.py",
                "        check_cluster_mesh(settings, reports)",
                "        pass",
            ),
        ),
        (_PARALLEL + "test_a_mesh_the_probed_nodes_cannot_hold_is_refused_before_any_node_starts",),
    ),
    Mutation(
        "cluster-pool-mesh-left-to-the-nodes",
        "a cluster pool's mesh the probed nodes cannot hold is refused before any node starts",
        (
            Edit(
                "launch/cluster/pool.py",
                "        check_cluster_mesh(settings, reports)  # before any node starts",
                "        pass  # before any node starts",
            ),
        ),
        (_PARALLEL + "test_a_mesh_the_probed_nodes_cannot_hold_is_refused_before_any_node_starts",),
    ),
)
