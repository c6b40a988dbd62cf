"""Deliberate breakages of ``breakpoint()`` on a rank: pdb typed at in the kernel's cell.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_UNIT = "tests/test_debugger.py::"
_KERNEL = "tests/test_debugger_kernel_integration.py::"
_P_AND_C = _KERNEL + (
    "test_p_prints_rank_1s_variable_while_rank_0_waits_in_all_reduce_and_c_ends_normally"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "breakpoint-reads-the-workers-stdin",
        "breakpoint() on a forked rank opens pdb in the kernel's cell",
        (
            Edit(
                "worker/entry.py",
                "            install_debugger(spec.rank, send, pipes.answers)\n",
                "            pass\n",
            ),
        ),
        (_P_AND_C,),
    ),
    Mutation(
        "pdb-quit-is-not-named",
        "q in a rank's pdb ends the run as that rank's failure, saying it quit the debugger",
        (
            Edit(
                "worker/debugger.py",
                '            raise DebuggerQuit(f"quit the debugger (q) at {channel.location}")',
                "            return",
            ),
        ),
        (
            _UNIT
            + "test_q_raises_debugger_quit_naming_where_and_interrupted_raises_keyboard_interrupt",
            _KERNEL + "test_q_ends_the_run_as_rank_1s_failure_and_the_next_launch_works",
        ),
    ),
    Mutation(
        "debugger-prompts-interleave",
        "two ranks at a breakpoint: one holds the prompt until it leaves, the other waits",
        (
            Edit(
                "launch/debugger_desk.py",
                "        if self.holder in self.waiting:\n            return self.holder\n",
                "",
            ),
            Edit(
                "launch/debugger_desk.py",
                "        if self.holder is None or time.monotonic() - self.answered",
                "        if True or time.monotonic() - self.answered",
            ),
        ),
        (
            _UNIT + "test_the_desk_keeps_one_rank_at_the_prompt_and_names_the_one_that_waits",
            _KERNEL + "test_two_ranks_at_a_breakpoint_take_the_prompt_one_after_the_other",
        ),
    ),
    Mutation(
        "waiting-rank-not-named",
        "a rank that waits for the prompt is named: 'rank 0 is also at a breakpoint, next'",
        (
            Edit(
                "launch/debugger_desk.py",
                '                lines += f"rank {rank} is also at a breakpoint, next\\n"',
                "                pass",
            ),
        ),
        (_UNIT + "test_the_desk_keeps_one_rank_at_the_prompt_and_names_the_one_that_waits",),
    ),
    Mutation(
        "no-stdin-fails-the-cell",
        "a frontend that allows no input: breakpoint() is skipped with one line, the run goes on",
        (
            Edit(
                "launch/debugger_desk.py",
                '        return bool(getattr(kernel, "_allow_stdin", True))',
                "        return True",
            ),
            Edit(
                "launch/debugger_desk.py",
                '        if type(error).__name__ == "StdinNotImplementedError":',
                "        if False:",
            ),
        ),
        (
            _KERNEL
            + "test_without_stdin_each_rank_says_which_breakpoint_it_skipped_and_the_run_goes_on",
        ),
    ),
    Mutation(
        "skipped-stop-shows-pdb",
        "a skipped breakpoint shows one line, not pdb's listing",
        (
            Edit(
                "launch/debugger_desk.py",
                '        return bool(getattr(kernel, "_allow_stdin", True))',
                "        return True",
            ),
        ),
        (
            _KERNEL
            + "test_without_stdin_each_rank_says_which_breakpoint_it_skipped_and_the_run_goes_on",
        ),
    ),
    Mutation(
        "break-ranks-ignored",
        "NOTEBOOK_KIT_BREAK_RANKS limits the ranks that stop; the others skip with one line",
        (
            Edit(
                "worker/debugger.py",
                "        if chosen is not None and self.rank not in chosen:",
                "        if False:",
            ),
        ),
        (
            _UNIT + "test_a_rank_not_chosen_skips_without_asking",
            _KERNEL + "test_notebook_kit_break_ranks_stops_one_rank_and_the_other_says_it_skipped",
        ),
    ),
    Mutation(
        "interrupt-at-the-prompt-not-told",
        "Ctrl-C at a rank's prompt tells that rank, so a pool's command ends interrupted",
        (
            Edit(
                "launch/debugger_desk.py",
                "            answer(rank, DebuggerLine(None, interrupted=True))\n",
                "",
            ),
        ),
        (
            _UNIT + "test_nobody_to_type_skips_without_holding_and_ctrl_c_tells_the_rank",
            _KERNEL + "test_an_interrupt_at_a_pool_ranks_prompt_interrupts_that_rank_and_the_"
            "pool_keeps_its_workers",
        ),
    ),
    Mutation(
        "stall-report-calls-the-debugged-rank-stuck",
        "the stall report says a rank at the pdb prompt is in the debugger",
        (
            Edit(
                "launch/stall_watch.py",
                "        if rank in in_debugger:\n",
                "        if False:\n",
            ),
        ),
        (_UNIT + "test_the_stall_report_says_a_rank_at_the_prompt_is_in_the_debugger",),
    ),
    Mutation(
        "rank-at-the-prompt-counted-late",
        "the rank hosting the store waits past rendezvous_timeout for a rank at its pdb prompt",
        (
            Edit(
                "worker/rendezvous.py",
                "            if not any(_debugging(rank) for rank in range(spec.plan.world_size)):",
                "            if True:",
            ),
        ),
        (
            _KERNEL + "test_a_rank_at_the_prompt_after_the_others_finished_is_waited_for_past_"
            "the_rendezvous_timeout",
        ),
    ),
    Mutation(
        "bad-break-ranks-found-only-at-the-breakpoint",
        "a bad NOTEBOOK_KIT_BREAK_RANKS is refused, naming it and the fix, before anything starts",
        (
            Edit(
                "launch/forking.py",
                "    break_ranks()  # each rank reads",
                "    # each rank reads",
            ),
        ),
        (_UNIT + "test_a_bad_break_ranks_value_is_refused_before_any_process_starts",),
    ),
    Mutation(
        "prompt-time-counts-against-timeout",
        "time spent at a rank's pdb prompt does not count against the launch's timeout",
        (
            Edit(
                "launch/supervisor.py",
                "                self._deadline += spent\n",
                "                pass\n",
            ),
        ),
        (_P_AND_C,),
    ),
)
