"""Deliberate breakages of ``%%distributed``'s cell options (--ranks, --noblock, --local, --out,
--interleave and their usage errors).

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_KERNEL = "tests/test_magic_options_kernel_integration.py::"
_SUBSET = "tests/test_magic_subset_integration.py::"
_BAD = _KERNEL + "test_a_bad_option_is_a_usage_error_before_anything_runs"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "subset-runs-everywhere",
        "a cell with --ranks runs on those ranks only; the others run nothing",
        (
            Edit(
                "launch/pool/worker_pool.py",
                '        on = self._wanted("all") if ranks is None else sorted(',
                '        on = self._wanted("all") if True else sorted(',
            ),
        ),
        (
            _KERNEL + "test_a_subset_runs_alone_and_the_other_ranks_keep_their_state",
            _SUBSET + "test_a_subset_runs_alone_and_returns_its_ranks_values",
        ),
    ),
    Mutation(
        "subset-shipment-counted-as-held",
        "a kernel value sent to some ranks only is sent again to the others when they need it",
        (
            Edit(
                "launch/pool/worker_pool.py",
                "                shipped=shipped if whole else None,",
                "                shipped=shipped,",
            ),
        ),
        (_SUBSET + "test_a_kernel_value_sent_to_some_ranks_reaches_the_others_later",),
    ),
    Mutation(
        "noblock-waits",
        "a --noblock cell returns at once with a running handle",
        (
            Edit(
                "launch/magic_result.py",
                "    while not in_line.wait(0.05) and thread.is_alive():\n",
                "    while thread.is_alive():\n",
            ),
        ),
        (_KERNEL + "test_noblock_returns_a_handle_and_its_lines_stay_under_its_cell",),
    ),
    Mutation(
        "noblock-lines-under-the-running-cell",
        "a --noblock cell's lines stay under the cell that started it while later cells run",
        (
            Edit(
                "launch/magic_result.py",
                "        target=context.run, args=(body,),",
                "        target=body,",
            ),
        ),
        (_KERNEL + "test_noblock_returns_a_handle_and_its_lines_stay_under_its_cell",),
    ),
    Mutation(
        "noblock-error-lost",
        "a --noblock cell's error is raised by its .result() and by %distributed wait",
        (
            Edit(
                "launch/magic_result.py",
                "            handle._finish(values, error)",
                "            handle._finish(values, None)",
            ),
        ),
        (_KERNEL + "test_distributed_wait_raises_the_noblock_error_and_out_lands_later",),
    ),
    Mutation(
        "noblock-interrupt-ignored",
        "a --noblock cell's interrupt() (and Ctrl-C in %distributed wait) interrupts its ranks",
        (
            Edit(
                "launch/pool/view.py",
                "        if self._interrupt is not None and self._interrupt.is_set():",
                "        if False:",
            ),
        ),
        (_KERNEL + "test_a_noblock_cell_is_interrupted_by_its_handle_or_ctrl_c_in_wait",),
    ),
    Mutation(
        "out-never-set",
        "--out NAME puts every rank's value in the kernel as NAME",
        (
            Edit(
                "launch/magic.py",
                "                self.shell.user_ns[chosen.out] = values",
                "                pass",
            ),
        ),
        (_KERNEL + "test_a_subset_runs_alone_and_the_other_ranks_keep_their_state",),
    ),
    Mutation(
        "local-runs-first",
        "--local runs the cell in the kernel after the ranks",
        (
            Edit(
                "launch/magic.py",
                "        try:\n            value = run()\n",
                "        run_locally(self.shell, cell) if chosen.local else None\n"
                "        try:\n            value = run()\n",
            ),
        ),
        (_KERNEL + "test_local_runs_the_cell_in_the_kernel_after_the_ranks",),
    ),
    Mutation(
        "local-error-swallowed",
        "--local: an error in the kernel's run ends the cell with an error",
        (Edit("launch/magic.py", "    if not outcome.success:", "    if False:"),),
        (_KERNEL + "test_local_runs_the_cell_in_the_kernel_after_the_ranks",),
    ),
    Mutation(
        "interleave-grouped",
        "--interleave prints each line as it arrives, after its rank",
        (
            Edit(
                "launch/pool/view.py",
                "(InterleavedText if interleave else GroupedText)(streams)",
                "GroupedText(streams)",
            ),
        ),
        (_KERNEL + "test_interleave_prefixes_lines_in_arrival_order",),
    ),
    Mutation(
        "absent-rank-accepted",
        "--ranks naming a rank the pool lacks is a usage error before anything runs",
        (
            Edit(
                "launch/magic_options.py",
                "        missing = [rank for rank in self.listed if rank >= world_size]",
                "        missing: list[int] = []",
            ),
        ),
        (_BAD,),
    ),
    Mutation(
        "ranks-checked-after-the-pool-starts",
        "--ranks beyond -n N is refused before the default pool is replaced or started",
        (
            Edit(
                "launch/magic.py",
                "        if chosen.ranks is not None and known is not None:",
                "        if False:",
            ),
        ),
        (_BAD,),
    ),
    Mutation(
        "opposite-layouts-accepted",
        "--group-outputs with --interleave is a usage error",
        (
            Edit(
                "launch/magic_options.py",
                "        if options.group_outputs and options.interleave:",
                "        if False:",
            ),
        ),
        (_BAD,),
    ),
)
