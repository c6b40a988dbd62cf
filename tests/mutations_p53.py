"""Deliberate breakages of profiles (``accelerator.profile()``) and of memory on out-of-memory.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_PROFILE = "tests/test_profile.py::"
_PROFILE_RANKS = (
    "tests/test_profile_integration.py::"
    "test_two_ranks_write_two_traces_named_as_accelerate_names_them"
)
_MEMORY = "tests/test_memory_history.py::"
_MEMORY_RUNS = "tests/test_memory_history_integration.py::"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "profile-trace-shared-by-ranks",
        "each rank writes its own Chrome trace, profile_<rank>.json, as Accelerate names it",
        (
            Edit(
                "accelerator/profiling.py",
                '    return f"profile_{process_index}.json"',
                '    return "profile_0.json"',
            ),
        ),
        (_PROFILE_RANKS,),
    ),
    Mutation(
        "profile-schedule-ignored",
        "schedule_option's wait, warmup and active steps are followed with prof.step()",
        (
            Edit(
                "accelerator/profiling.py",
                "            schedule = torch.profiler.schedule(**self.schedule_option)",
                "            pass",
            ),
        ),
        (f"{_PROFILE}test_schedule_option_steps_through_wait_warmup_and_active_with_prof_step",),
    ),
    Mutation(
        "profile-bad-activity-accepted",
        "an unknown profiler activity is refused when ProfileKwargs is made, naming the field",
        (
            Edit(
                "accelerator/profiling.py",
                "        if name not in usable:",
                "        if name not in usable and False:",
            ),
        ),
        (
            f"{_PROFILE}test_bad_fields_are_refused_when_made_naming_the_field",
            f"{_PROFILE}test_accelerates_object_with_a_bad_activity_is_refused_before_the_block",
        ),
    ),
    Mutation(
        "accelerates-profile-kwargs-refused",
        "Accelerate's own ProfileKwargs is taken in kwargs_handlers",
        (
            Edit(
                "accelerator/handlers.py",
                '    ProfileKwargs: "profile",\n',
                "",
            ),
        ),
        (
            f"{_PROFILE}test_accelerates_own_profile_kwargs_is_taken_field_by_field",
            _PROFILE_RANKS,
        ),
    ),
    Mutation(
        "oom-note-dropped",
        "a rank's out-of-memory error names its largest allocations and the snapshot's path",
        (
            Edit(
                "worker/memory_history.py",
                "    error.add_note(note)\n",
                "",
            ),
        ),
        (
            f"{_MEMORY}test_an_out_of_memory_error_saves_the_snapshot_and_carries_the_note",
            f"{_MEMORY_RUNS}test_a_launched_rank_out_of_memory_shows_its_allocations_under_its"
            "_traceback",
        ),
    ),
    Mutation(
        "oom-summary-names-torchs-line",
        "the largest allocations are named by the user's line, not torch's inside it",
        (
            Edit(
                "worker/memory_summary.py",
                "    frame = (outside or frames)[0]",
                "    frame = frames[0]",
            ),
        ),
        (f"{_MEMORY}test_live_blocks_are_summed_by_the_user_line_that_made_them_largest_first",),
    ),
    Mutation(
        "oom-freed-blocks-counted",
        "only live blocks count among the largest allocations",
        (
            Edit(
                "worker/memory_summary.py",
                '            if block.get("state") == LIVE:',
                "            if True:",
            ),
        ),
        (f"{_MEMORY}test_live_blocks_are_summed_by_the_user_line_that_made_them_largest_first",),
    ),
    Mutation(
        "memory-history-on-cpu-accepted",
        "memory_history=True for ranks on the CPU is refused before anything starts",
        (
            Edit(
                "launch/plan.py",
                '    if not config.memory_history or device == "cuda":\n        return\n',
                "    return\n",
            ),
        ),
        (f"{_MEMORY_RUNS}test_memory_history_on_the_cpu_is_refused_before_anything_starts",),
    ),
    Mutation(
        "forked-rank-not-recording",
        "a forked rank (a launch's, a pool's) records its allocator under memory_history=True",
        (
            Edit(
                "worker/entry.py",
                "                with _memory_recorded(spec):\n",
                "                with contextlib.nullcontext():\n",
            ),
        ),
        (
            f"{_MEMORY_RUNS}test_a_launched_rank_out_of_memory_shows_its_allocations_under_its"
            "_traceback",
            f"{_MEMORY_RUNS}test_a_pool_commands_out_of_memory_shows_its_allocations_and_the"
            "_pool_goes_on",
        ),
    ),
    Mutation(
        "kernel-run-not-recording",
        "a run in the kernel itself records its allocator under memory_history=True",
        (
            Edit(
                "launch/calling_process.py",
                "with recording_memory(plan.memory_history, ",
                "with recording_memory(False, ",
            ),
        ),
        (
            f"{_MEMORY_RUNS}test_a_run_in_the_kernel_raises_the_error_itself_with_its_allocations"
            "_noted",
        ),
    ),
    Mutation(
        "pool-oom-not-noted",
        "a pool command's out-of-memory error names its largest allocations too",
        (
            Edit(
                "worker/pool/command_loop.py",
                "            note_out_of_memory(value)",
                "            pass",
            ),
        ),
        (
            f"{_MEMORY_RUNS}test_a_pool_commands_out_of_memory_shows_its_allocations_and_the"
            "_pool_goes_on",
        ),
    ),
)
