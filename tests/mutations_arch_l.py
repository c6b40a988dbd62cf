"""Deliberate breakages of the live view's panels: the list every display asks, and each place.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_PANELS = "tests/test_panels.py::"
_HEADLESS = f"{_PANELS}test_a_new_panel_prints_its_line_at_the_end_and_is_kept_in_last_run"
_BAR = (
    "tests/test_live.py::"
    "test_live_observer_sends_only_new_points_and_shows_progress_without_an_empty_bar"
)
_LIVE = f"{_PANELS}test_a_new_panel_shows_its_line_under_the_plot_and_under_the_summary"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "panels-never-see-the-messages",
        "a panel sees every metrics batch a worker sends",
        (Edit("live/record.py", "            panel.take(batch)\n", "            pass\n"),),
        (_HEADLESS,),
    ),
    Mutation(
        "panel-records-left-out-of-last-run",
        "last_run() keeps what each panel records, by its name",
        (
            Edit(
                "live/record.py",
                "panels={panel.name: panel.record() for panel in self.panels},",
                "panels={},",
            ),
        ),
        (_HEADLESS,),
    ),
    Mutation(
        "panel-headless-lines-never-printed",
        "a run without a notebook prints each panel's line at its end",
        (
            Edit(
                "live/headless.py",
                'for _, text in self.recorder.texts("headless"):',
                'for _, text in self.recorder.texts("headless")[:0]:',
            ),
        ),
        (_HEADLESS,),
    ),
    Mutation(
        "panel-restarted-without-its-start",
        "a panel is told when each attempt starts",
        (Edit("live/record.py", "            panel.start(info)\n", "            pass\n"),),
        ("tests/test_speed.py::test_the_view_of_a_cluster_run_adds_a_line_per_node",),
    ),
    Mutation(
        "panel-line-made-once-per-tick",
        "a panel's line under the plot is one widget, made once and then updated",
        (
            Edit(
                "live/notebook_view.py",
                "value, widget = panel.live_html(), self.lines.get(panel.name)",
                "value, widget = panel.live_html(), None",
            ),
        ),
        (_LIVE,),
    ),
    Mutation(
        "panel-details-left-out",
        "the details under the summary hold each panel's block (the evaluation rounds)",
        (
            Edit(
                "live/notebook_view.py",
                "blocks = [block for panel in panels if (block := panel.details())]",
                "blocks: list[tuple[str, str]] = []",
            ),
        ),
        (
            "tests/test_live_notebook.py::"
            "test_nbconvert_html_without_widget_state_shows_summary_plot_table_and_ranks",
        ),
    ),
    Mutation(
        "status-panel-without-its-note",
        "the status line warns once metric records were dropped",
        (
            Edit(
                "live/progress_bar.py",
                'extra = f" · <b>{html.escape(note)}</b>" if dropped else ""',
                'extra = ""',
            ),
        ),
        (_BAR,),
    ),
    Mutation(
        "progress-panel-without-its-bar",
        "the progress bar shows once a total is known",
        (
            Edit(
                "live/progress_bar.py",
                "self.fraction = min(count, total) / total if total else None",
                "self.fraction = None",
            ),
        ),
        (_BAR,),
    ),
)
