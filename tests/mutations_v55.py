"""Deliberate breakages of the live view at many ranks: grouped output, the rank filter, the
speed line's summary of many ranks and nodes, and the size of the saved notebook.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_UNIT = "tests/test_rank_groups.py::"
_GROUPED = _UNIT + "test_many_ranks_show_as_one_tab_of_groups_failed_and_straggler_first"
_FILTER = _UNIT + "test_the_rank_filter_shows_the_ranks_own_lines_and_says_what_is_wrong"
_SPEED = (
    _UNIT + "test_the_speed_line_of_many_ranks_names_the_median_the_slowest_three_and_the_straggler"
)
_KERNEL = (
    "tests/test_live_scale_kernel_integration.py::"
    "test_32_ranks_on_8_nodes_show_grouped_lines_every_point_and_every_rank_in_the_record"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "output-a-tab-per-rank-at-any-scale",
        "past 8 ranks the ranks' output is one tab of grouped lines, not a tab per rank",
        (
            Edit(
                "live/rank_output.py",
                "        elif len(info.ranks) > GROUPED_ABOVE:",
                "        elif False:",
            ),
        ),
        (_GROUPED, _KERNEL),
    ),
    Mutation(
        "output-lines-alike-not-grouped",
        "ranks that print the same line share one line naming them",
        (
            Edit(
                "live/rank_groups.py",
                "        group = self._groups.get(text)\n",
                "        group = None\n",
            ),
        ),
        (_UNIT + "test_lines_alike_share_one_line_in_the_order_they_first_came",),
    ),
    Mutation(
        "rank-spec-without-ranges",
        "the ranks of a line are written as ranges (0–3, 8, 10–12), not one by one",
        (
            Edit(
                "live/rank_groups.py",
                "        if runs and number == runs[-1][1] + 1:",
                "        if False:",
            ),
        ),
        (_UNIT + "test_ranks_are_written_as_ranges_and_lists_and_long_lists_are_counted",),
    ),
    Mutation(
        "rank-filter-takes-ranks-the-run-lacks",
        "a filter naming a rank the run does not have is refused with a message naming it",
        (Edit("live/rank_groups.py", "        if missing:\n", "        if False:\n"),),
        (_UNIT + "test_the_rank_filter_reads_ranges_and_names_what_is_wrong", _FILTER),
    ),
    Mutation(
        "output-failed-ranks-not-first",
        "the failed ranks come first in the grouped output, with the end of their traceback",
        (Edit("live/grouped_output.py", "    failed = list(lines.failed)\n", "    failed = []\n"),),
        (_GROUPED,),
    ),
    Mutation(
        "output-straggler-not-first",
        "the straggler the speed figures name comes first in the grouped output",
        (
            Edit(
                "live/rank_output.py",
                '        self.lines.straggler = getattr(figures, "straggler", None)',
                "        self.lines.straggler = None",
            ),
        ),
        (_GROUPED,),
    ),
    Mutation(
        "output-distinct-lines-unbounded",
        "the kernel keeps a bounded number of distinct lines, counting those it lets go",
        (
            Edit(
                "live/rank_groups.py",
                "            if len(self._groups) > _KEPT_GROUPS:",
                "            if False:",
            ),
        ),
        (_UNIT + "test_distinct_lines_past_the_bound_are_counted_and_let_go_the_oldest_first",),
    ),
    Mutation(
        "output-saved-rows-unbounded",
        "a saved notebook of 512 ranks x 100 lines stays under 1 MB however distinct the lines",
        (
            Edit(
                "live/grouped_output.py",
                "for group in groups[-limit:]\n",
                "for group in groups\n",
            ),
        ),
        (_UNIT + "test_512_ranks_printing_100_lines_each_save_under_a_megabyte",),
    ),
    Mutation(
        "output-filter-ignored",
        "a rank filter shows those ranks' own lines as they printed them",
        (
            Edit(
                "live/grouped_output.py",
                "        if self._picked is None:\n            rows = grouped_rows(",
                "        if True:\n            rows = grouped_rows(",
            ),
        ),
        (_FILTER,),
    ),
    Mutation(
        "output-bad-filter-silent",
        "a bad rank filter says what is wrong and how to write one",
        (
            Edit(
                "live/grouped_output.py",
                '                self.note.value = f\'<span style="color:#b00020">'
                "{html.escape(str(error))}</span>'",
                "                self.note.value = HINT",
            ),
        ),
        (_FILTER,),
    ),
    Mutation(
        "output-filter-not-served-mid-run",
        "the rank filter is served while the cell runs, as the Stop button is",
        (
            Edit(
                "live/rank_output.py",
                "        return [self.grouped.filter] if self.grouped is not None else []",
                "        return []",
            ),
        ),
        (_FILTER,),
    ),
    Mutation(
        "headless-lines-alike-printed-per-rank",
        "without a notebook, lines many ranks print alike are printed once, naming the ranks",
        (
            Edit(
                "live/headless.py",
                "        self.grouped = len(info.ranks) > GROUPED_ABOVE\n",
                "        self.grouped = False\n",
            ),
        ),
        (_UNIT + "test_without_a_notebook_lines_many_ranks_print_alike_are_printed_once",),
    ),
    Mutation(
        "speed-many-ranks-without-median",
        "the speed line of many ranks names their median step and the slowest three",
        (
            Edit(
                "live/speed.py",
                '    spread = _spread(speed.ranks) if len(speed.ranks) > GROUPED_ABOVE else ""',
                '    spread = ""',
            ),
        ),
        (_SPEED, _KERNEL),
    ),
    Mutation(
        "speed-a-line-per-node-for-many-nodes",
        "many nodes share one speed line (their median and the slowest), not a line each",
        (
            Edit(
                "live/speed.py",
                "    if rank_nodes and _nodes(rank_nodes) > GROUPED_ABOVE:",
                "    if False:",
            ),
        ),
        (_SPEED,),
    ),
)
