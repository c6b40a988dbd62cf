"""Deliberate breakages of ``find_executable_batch_size``: one size that every rank agrees on.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_UNIT = "tests/test_batch_size.py::"
_REAL = "tests/test_batch_size_integration.py::"
_HARD_CASE = (
    _REAL + "test_rank_1_out_of_memory_while_rank_0_waits_in_all_reduce_restarts_both_at_half"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "batch-size-retried-alone-in-a-launch",
        "a rank out of memory in a launch restarts every rank at the smaller size",
        (
            Edit(
                "accelerator/batch_size.py",
                "                if agreed is None:\n                    self.size = smaller",
                "                if True:\n                    self.size = smaller",
            ),
        ),
        (
            _UNIT
            + "test_in_a_launch_a_rank_out_of_memory_asks_every_rank_to_restart_at_the_agreed_size",
            _HARD_CASE,
        ),
    ),
    Mutation(
        "batch-size-restart-charges-max-restarts",
        "a restart at a smaller batch size does not use up max_restarts",
        (
            Edit(
                "launch/restarts.py",
                "if agreement is None or not agreement.agrees_after(_failure_of(ending)):",
                "if True:",
            ),
        ),
        (
            _UNIT + "test_the_policy_restarts_every_rank_smaller_without_charging_max_restarts",
            _HARD_CASE,
        ),
    ),
    Mutation(
        "agreed-batch-size-not-read",
        "a restarted rank starts at the size every rank agreed on",
        (
            Edit(
                "accelerator/batch_size.py",
                "            self.size = agreed.get(self.key, self.size)",
                "            pass",
            ),
        ),
        (
            _UNIT
            + "test_in_a_launch_a_rank_out_of_memory_asks_every_rank_to_restart_at_the_agreed_size",
            _HARD_CASE,
        ),
    ),
    Mutation(
        "agreed-batch-size-not-forked-with",
        "the workers of each attempt are forked with the sizes agreed so far",
        (
            Edit(
                "launch/batch_sizes.py",
                "temporary_environment({AGREED_SIZES_VARIABLE: json.dumps(self.sizes)})",
                "temporary_environment({})",
            ),
        ),
        (
            _UNIT + "test_the_policy_restarts_every_rank_smaller_without_charging_max_restarts",
            _HARD_CASE,
            _REAL + "test_workers_started_from_the_clean_template_agree_on_the_size_too",
        ),
    ),
    Mutation(
        "batch-size-restarts-unbounded",
        "each batch-size restart is smaller than the last, so they end",
        (
            Edit(
                "launch/batch_sizes.py",
                "        if not 0 < reduction.next_size < min(before, reduction.size):",
                "        if not 0 < reduction.next_size:",
            ),
        ),
        (
            _UNIT
            + "test_a_reduction_that_does_not_shrink_or_a_policy_without_agreement_is_a_failure",
        ),
    ),
    Mutation(
        "batch-size-search-not-refused-in-a-pool",
        "several ranks that no launch can restart (a pool) refuse the search, naming the fix",
        (
            Edit(
                "accelerator/batch_size.py",
                "    if agreed is None:\n        raise RuntimeError(",
                "    if agreed is None:\n        return rank, None\n        raise RuntimeError(",
            ),
        ),
        (
            _UNIT
            + "test_several_ranks_outside_a_restarting_launch_are_refused_before_the_function_runs",
            _REAL + "test_a_pool_refuses_a_search_on_several_ranks_and_keeps_its_workers",
        ),
    ),
    Mutation(
        "batch-size-agreed-across-machines",
        "a launch over several machines refuses the search: each kernel restarts only its ranks",
        (
            Edit(
                "accelerator/batch_size.py",
                "if context is None or context.num_nodes == 1 else None",
                "if True else None",
            ),
        ),
        (
            _UNIT
            + "test_several_ranks_outside_a_restarting_launch_are_refused_before_the_function_runs",
        ),
    ),
    Mutation(
        "torch-out-of-memory-error-not-caught",
        "torch.OutOfMemoryError reduces the batch size, whatever its message",
        (
            Edit(
                "accelerator/batch_size.py",
                "    if isinstance(exception, torch.OutOfMemoryError):\n        return True",
                "    if False:\n        return True",
            ),
        ),
        (_UNIT + "test_reaching_zero_names_the_function_and_its_starting_size", _HARD_CASE),
    ),
    Mutation(
        "batch-size-search-below-zero",
        "a search that reaches zero ends with an error naming the function and starting size",
        (
            Edit(
                "accelerator/batch_size.py",
                "                elif smaller <= 0:\n",
                "                elif False:\n",
            ),
        ),
        (_REAL + "test_a_search_that_reaches_zero_ends_the_launch_naming_the_function",),
    ),
    Mutation(
        "batch-size-argument-not-guarded",
        "passing the batch size that the decorator passes is a TypeError naming the call",
        (
            Edit(
                "accelerator/batch_size.py",
                "        if len(params) < len(args) + 1:",
                "        if False:",
            ),
        ),
        (_UNIT + "test_passing_the_batch_size_is_a_type_error_and_other_errors_pass_through",),
    ),
)
