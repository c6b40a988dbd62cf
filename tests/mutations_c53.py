"""Deliberate breakages of the text a run without a notebook prints as it goes: a progress line
every interval, at the rate the summary panel measures from the first step.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_LINES = (
    "tests/test_live.py::test_without_a_notebook_progress_lines_come_every_interval_with_the_rate"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "headless-progress-lines-never-printed",
        "without a notebook a progress line is printed every interval while the run goes",
        (
            Edit(
                "live/headless.py",
                "        if time.monotonic() - self._last_line >= self.interval:",
                "        if False:",
            ),
        ),
        (_LINES,),
    ),
    Mutation(
        "headless-progress-without-its-rate",
        "the progress lines carry the rate measured from the first step, as the last line does",
        (
            Edit(
                "live/summary.py",
                "        self.clock.observe(self.run.progress.count)",
                "        pass",
            ),
        ),
        (_LINES,),
    ),
)
