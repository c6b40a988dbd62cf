"""Deliberate breakages of the live view, the speed line and the warm-up.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_WARMUP = "tests/test_warmup_integration.py::"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "warmup-done-set-at-start",
        "workers fork only once the warm-up's imports are done, never before they began",
        (
            Edit(
                "launch/warmup.py",
                "def _import_all() -> None:\n    try:\n",
                "def _import_all() -> None:\n    _done.set()\n    try:\n",
            ),
        ),
        (f"{_WARMUP}test_workers_fork_after_the_warm_up_even_when_its_thread_starts_late",),
    ),
    Mutation(
        "ray-dead-nodes-places-present",
        "a restart is offered the places of alive Ray nodes only",
        (
            # Ray lists a dead node with no resources, so its places leave the fresh read even
            # without the "Alive" check: they stay where a read keeps every place it saw.
            Edit(
                "launch/cluster/engines/ray.py",
                'if not node.get("Alive") or resources.get("CPU", 0) < 1:',
                'if resources.get("CPU", 0) < 1:',
            ),
            Edit(
                "launch/cluster/engines/ray.py",
                '        return {name: {"host": place.node_id} for name, place in'
                " self._read_places().items()}\n",
                "        self._read_places()\n"
                '        return {name: {"host": p.node_id} for name, p in self._places.items()}\n',
            ),
        ),
        ("tests/test_ray_integration.py::test_a_ray_node_that_left_offers_no_places_to_a_restart",),
    ),
    Mutation(
        "live-view-imported-where-a-press-tears-it",
        "no press leaves the live view's imports half done",
        (
            Edit(
                "launch/launchers/base.py",
                "    import_whole(functools.partial(prepare_live_view, live))\n",
                "    prepare_live_view(live)\n",
            ),
        ),
        (f"{_WARMUP}test_presses_during_the_live_views_first_imports_never_leave_them_half_done",),
    ),
    Mutation(
        "restart-shows-a-second-view",
        "a restarted launch leaves one live view, its summary naming the cause and each step once",
        (
            Edit(
                "live/notebook_view.py",
                "        if self._handle is not None:  # a restart: in place of the last",
                "        if False:  # a restart: in place of the last",
            ),
        ),
        ("tests/test_live.py::test_a_restarted_launch_shows_one_view_in_place_of_the_last",),
    ),
    Mutation(
        "resumed-steps-counted-from-zero",
        "a restarted run's summary counts every step once",
        (
            Edit(
                "live/progress.py",
                "            return self.before + self.steps\n",
                "            return self.steps\n",
            ),
        ),
        ("tests/test_live.py::test_a_restarted_launch_shows_one_view_in_place_of_the_last",),
    ),
    Mutation(
        "steps-from-one-counted-from-zero",
        "a run that numbers its steps from 1 is counted 60 steps for 60, not 61",
        (
            Edit(
                "live/progress.py",
                "        return 1 if self.first_logged == 1 else 0\n",
                "        return 0\n",
            ),
        ),
        (
            "tests/test_live.py::test_steps_logged_from_one_or_now_and_then_count_as_the_steps_taken",
        ),
    ),
    Mutation(
        "lost-node-summarised-as-exited",
        "a failed run's summary names the root cause, a lost node as lost",
        (
            Edit(
                "live/summary.py",
                '        return failure.message.partition(":")[0]\n',
                '        return "exited"\n',
            ),
        ),
        ("tests/test_live.py::test_a_restarted_launch_shows_one_view_in_place_of_the_last",),
    ),
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
                "runtime/step_clock.py",
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
                "runtime/step_clock.py",
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
