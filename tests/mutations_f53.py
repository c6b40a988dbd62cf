"""Deliberate breakages of the live view's Stacks and Profile buttons and of
``notebook_kit.profile()`` (the next steps of a running launch, profiled on every rank).

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_BUTTONS = "tests/test_view_buttons_kernel_integration.py::"
_STACKS_BUTTON = (
    _BUTTONS + "test_clicking_stacks_mid_run_shows_every_rank_under_the_plot_and_keeps_them"
)
_PROFILE_BUTTON = (
    _BUTTONS
    + "test_clicking_profile_mid_run_shows_each_ranks_operators_and_timeline_and_keeps_them"
)
_PROFILE = "tests/test_step_profile_integration.py::"
_MID_RUN = _PROFILE + "test_profile_three_steps_mid_run_writes_each_ranks_trace_and_table"
_BAD_STEPS = _PROFILE + "test_bad_steps_are_refused_naming_steps_before_anything_is_asked"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "stacks-button-click-never-asks",
        "a click on Stacks asks every rank for its stacks at the next refresh",
        (
            Edit(
                "live/ask_button.py",
                "            self._future = self.ask()\n",
                "            pass\n",
            ),
        ),
        (_STACKS_BUTTON,),
    ),
    Mutation(
        "stacks-button-leaves-nothing-in-the-saved-notebook",
        "the last stacks taken stay as plain text under the summary",
        (
            Edit(
                "live/stacks_panel.py",
                '        return {"text/plain": self._text()} if self.texts is not None else None',
                "        return None",
            ),
        ),
        (_STACKS_BUTTON,),
    ),
    Mutation(
        "profile-slot-never-read-at-a-step",
        "the step clock carries out a profile order at the next step boundary",
        (
            Edit(
                "runtime/step_clock.py",
                "            self.profiling.boundary(self, self._began is not None, True)\n",
                "            pass\n",
            ),
        ),
        (_MID_RUN, _PROFILE_BUTTON),
    ),
    Mutation(
        "profile-backward-never-a-step",
        "a loop that neither a prepared loader nor log(samples=) steps is profiled by backward",
        (
            Edit(
                "runtime/step_clock.py",
                "self.profiling.boundary(self, True, True)  # here: each backward ends one",
                "pass",
            ),
        ),
        (_MID_RUN + "[backward_only]",),
    ),
    Mutation(
        "profile-records-one-step-too-many",
        "profile(steps=N) records N steps, no more",
        (
            Edit(
                "worker/step_profiler.py",
                "            if self.done >= self.order.steps:\n",
                "            if self.done > self.order.steps:\n",
            ),
        ),
        (_MID_RUN,),
    ),
    Mutation(
        "profile-answers-never-reach-the-request",
        "each rank's profile reaches the profile() call that asked for it",
        (
            Edit(
                "launch/supervisor.py",
                "            self.stacks.on_profile(worker.rank, message)\n",
                "",
            ),
        ),
        (_MID_RUN,),
    ),
    Mutation(
        "profile-takes-zero-steps",
        "profile(steps=0) is refused naming steps, before anything is asked",
        (Edit("launch/profile_requests.py", "    if steps <= 0:\n", "    if steps < 0:\n"),),
        (_BAD_STEPS,),
    ),
    Mutation(
        "profile-not-kept-by-last-run",
        "last_run().profile keeps the traces and tables of a profile taken during the run",
        (Edit("live/profile_panel.py", "        panel.results = results\n", "        pass\n"),),
        (_MID_RUN,),
    ),
    Mutation(
        "profile-sends-an-empty-table",
        "each rank sends home its top operators",
        (
            Edit(
                "worker/step_profiler.py",
                "        for a in rows[:TOP_OPERATORS]\n",
                "        for a in rows[:0]\n",
            ),
        ),
        (_MID_RUN, _PROFILE_BUTTON),
    ),
)
