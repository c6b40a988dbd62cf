"""Deliberate breakages of the post-mortem of a failed rank (``pool.debug()``,
``%%distributed --pdb``, ``post_mortem=True``).

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_UNIT = "tests/test_post_mortem.py::"
_KERNEL = "tests/test_post_mortem_kernel_integration.py::"
_REFUSALS = (
    _UNIT + "test_pool_debug_refuses_what_it_cannot_open_and_otherwise_says_why_nobody_typed"
)
_POOL_AT_ONCE = (
    _UNIT
    + "test_a_pool_keeps_the_failed_frames_until_the_next_command_and_post_mortem_opens_at_once"
)
_LAUNCH_HEADLESS = (
    _UNIT + "test_a_launch_with_post_mortem_and_nobody_to_type_says_it_skipped_and_fails_as_usual"
)
_Q = _UNIT + "test_post_mortem_opens_in_the_failing_frame_with_its_locals_and_q_raises_nothing"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "pool-forgets-the-failed-command",
        "a pool worker keeps its last failed command's exception for pool.debug()",
        (
            Edit(
                "worker/pool/command_loop.py",
                "            if self.failed is None:  # (a debug that failed keeps",
                "            if False:  # (a debug that failed keeps",
            ),
        ),
        (_REFUSALS,),
    ),
    Mutation(
        "pool-keeps-failed-frames-forever",
        "the next command drops the failed command's frames, so they hold no memory",
        (
            Edit(
                "worker/pool/command_loop.py",
                "            self.failed = None  # its frames hold",
                "            pass  # its frames hold",
            ),
        ),
        (_POOL_AT_ONCE,),
    ),
    Mutation(
        "pool-debug-ignores-rank",
        "pool.debug(rank=) opens the rank asked for, not always the root cause",
        (
            Edit(
                "launch/pool/post_mortem.py",
                "        return last.ranks[0] if rank is None else rank\n",
                "        return last.ranks[0]\n",
            ),
        ),
        (
            _KERNEL
            + "test_rank_chooses_among_the_failed_ranks_and_the_others_are_refused_before_sending",
        ),
    ),
    Mutation(
        "pool-debug-after-restart-not-refused",
        "pool.debug() after the workers were restarted is refused: the frames are gone",
        (
            Edit(
                "launch/pool/post_mortem.py",
                'gone = last.gone or ("" if tuple(pids) == last.pids else',
                'gone = last.gone or ("" if True else',
            ),
        ),
        (_REFUSALS,),
    ),
    Mutation(
        "pool-debug-sent-to-every-rank",
        "pool.debug() asks the chosen rank only; the others keep running nothing",
        (Edit("launch/pool/post_mortem.py", "on=[chosen])", "on=None)"),),
        (_REFUSALS,),
    ),
    Mutation(
        "post-mortem-q-fails-the-command",
        "q ends a post-mortem without raising: the pool stays usable, a launch fails as before",
        (
            Edit(
                "worker/debugger.py",
                "    with contextlib.suppress(DebuggerQuit):\n",
                "    with contextlib.suppress():\n",
            ),
        ),
        (_Q,),
    ),
    Mutation(
        "secondary-errors-open-a-post-mortem",
        "a rank whose error only says a peer went away opens no second prompt",
        (
            Edit(
                "worker/debugger.py",
                "    return not is_consequence(type(error).__qualname__, str(error))\n",
                "    return True\n",
            ),
        ),
        (_UNIT + "test_only_an_error_of_the_ranks_own_code_is_worth_a_post_mortem",),
    ),
    Mutation(
        "launch-post-mortem-never-opens",
        "post_mortem=True: a launch's failing rank opens pdb before it reports",
        (
            Edit(
                "worker/entry.py",
                "        if spec.plan.post_mortem and worth_a_post_mortem(error):",
                "        if False and worth_a_post_mortem(error):",
            ),
        ),
        (_LAUNCH_HEADLESS,),
    ),
    Mutation(
        "post-mortem-setting-dropped",
        "post_mortem= reaches the plan the workers read",
        (
            Edit(
                "launch/launcher.py",
                "    return dataclasses.replace(plan, post_mortem=post_mortem)\n",
                "    return plan\n",
            ),
        ),
        (_LAUNCH_HEADLESS, _POOL_AT_ONCE),
    ),
    Mutation(
        "pool-post-mortem-not-given-to-workers",
        "WorkerPool(post_mortem=True): every failed command opens pdb at once",
        (
            Edit(
                "launch/pool/workers.py",
                '{"post_mortem": self.plan.post_mortem}',
                "{}",
            ),
        ),
        (_POOL_AT_ONCE,),
    ),
    Mutation(
        "pool-timeout-counts-time-at-the-prompt",
        "the time a pool command waits at a pdb prompt counts against no timeout=",
        (
            Edit(
                "launch/pool/workers.py",
                "deadline + self.at_prompt  # not the code's",
                "deadline  # not the code's",
            ),
        ),
        (f"{_KERNEL}test_the_time_at_a_pool_ranks_prompt_counts_against_no_timeout",),
    ),
    Mutation(
        "distributed-pdb-ignored",
        "%%distributed --pdb opens the failing rank's post-mortem in the same cell",
        (Edit("launch/magic.py", "            if chosen.pdb:\n", "            if False:\n"),),
        (
            f"{_KERNEL}test_a_distributed_cell_with_pdb_opens_the_failing_rank_at_once_"
            "then_shows_its_error",
        ),
    ),
)
