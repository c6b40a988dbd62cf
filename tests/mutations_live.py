"""Deliberate breakages of the live view, the speed line and the warm-up.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "speed-newest-record-dropped-when-full",
        "under a flood of log calls the newest record of every rank arrives exactly",
        (
            Edit(
                "runtime/metrics.py",
                "            self._keep_newest((self.context.rank, step, values))\n",
                "            self.dropped += 1\n",
            ),
        ),
        (
            "tests/test_metrics.py::test_a_blocked_kernel_never_blocks_log_and_drops_are_counted",
            "tests/test_output_flood_integration.py::"
            "test_a_flood_of_log_calls_drops_points_in_between_but_keeps_each_rank_s_newest",
        ),
    ),
    Mutation(
        "speed-rate-over-an-untimed-span",
        "no samples/s, steps/s or MFU until every rank that counted has timed a step",
        (
            Edit(
                "live/speed.py",
                " and all(r.timed_steps for r in ranks.values() if r.batches)",
                "",
            ),
        ),
        (
            "tests/test_speed.py::test_no_rate_until_every_rank_that_counted_has_timed_a_step",
            "tests/test_speed_integration.py::test_a_run_that_times_no_step_shows_no_rate",
        ),
    ),
    Mutation(
        "speed-stop-vote-timed-as-compute",
        "the straggler is named in the resumable loop: the Stop vote is the faster rank's wait",
        (
            Edit(
                "runtime/stopping.py",
                "    with waiting_on_ranks(context):  # a faster rank waits here",
                "    if True:  # a faster rank waits here",
            ),
        ),
        (
            "tests/test_speed_integration.py::"
            "test_the_straggler_is_named_in_the_resumable_loop_its_votes_and_checkpoints_timed_as_waiting[vote]",
        ),
    ),
    Mutation(
        "speed-checkpoint-agreement-timed-as-compute",
        "save_state's agreement between the ranks is the faster rank's wait",
        (
            Edit(
                "accelerator/collective_guard.py",
                "            with waiting_on_ranks(current_launch()):",
                "            if True:",
            ),
            Edit(
                "accelerator/operations.py",
                "    with waiting_on_ranks(current_launch()):  # waiting for the others: not this "
                "rank's compute\n        dist.all_gather_object(",
                "    if True:\n        dist.all_gather_object(",
            ),
            Edit(
                "accelerator/operations.py",
                "    with waiting_on_ranks(current_launch()):  # waiting for the others: not this "
                "rank's compute\n        dist.broadcast_object_list(",
                "    if True:\n        dist.broadcast_object_list(",
            ),
        ),
        (
            "tests/test_speed_integration.py::"
            "test_the_straggler_is_named_in_the_resumable_loop_its_votes_and_checkpoints_timed_as_waiting[checkpoint]",
        ),
    ),
    Mutation(
        "speed-background-save-wait-counted",
        "only the training thread's collectives during a step count as its wait",
        (
            Edit(
                "runtime/throughput.py",
                "        if self._began is not None and threading.get_ident() == self._owner:\n",
                "        if self._began is not None:\n",
            ),
        ),
        (
            "tests/test_speed.py::"
            "test_the_runtimes_collectives_in_a_step_are_its_wait_but_not_between_steps_or_elsewhere",
        ),
    ),
    Mutation(
        "speed-cut-step-wait-carried-over",
        "the wait of a step cut short by a break goes with it, not into the next pass's step",
        (
            Edit(
                "runtime/throughput.py",
                "        self._waited = 0.0  # a step cut short by a break: its waits go with it\n",
                "",
            ),
        ),
        (
            "tests/test_speed.py::"
            "test_the_runtimes_collectives_in_a_step_are_its_wait_but_not_between_steps_or_elsewhere",
        ),
    ),
)
