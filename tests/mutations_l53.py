"""Deliberate breakages of the live view's layout of its panels: the one list, and each hook
the view drives (its widgets, their clicks, its redraw, its place, its summary and output).

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_PINGS = (
    "tests/test_live_panels.py::"
    "test_a_panel_with_widgets_of_its_own_is_placed_routed_drawn_and_shown_at_the_end"
)
_NEW_LINE = (
    "tests/test_panels.py::test_a_new_panel_shows_its_line_under_the_plot_and_under_the_summary"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "panel-dropped-from-the-list",
        "every figure in the one list is shown: the Stop button among them",
        (Edit("live/record.py", "    StopPanel,\n", ""),),
        (_PINGS,),
    ),
    Mutation(
        "panel-summary-hook-ignored",
        "the end of a run shows each panel's summary lines, the summary line first",
        (
            Edit(
                "live/notebook_view.py",
                "for panel in panels if (text := panel.summary())]",
                'for panel in panels if (text := panel.summary()) and panel.name == "summary"]',
            ),
        ),
        (_NEW_LINE, _PINGS),
    ),
    Mutation(
        "panel-output-ignored",
        "a panel's output of its own (the plot's PNG) is shown under the summary",
        (
            Edit(
                "live/notebook_view.py",
                "for output in (panel.output() for panel in panels):",
                "for output in ():",
            ),
        ),
        (_PINGS,),
    ),
    Mutation(
        "panel-controls-left-unrouted",
        "every panel's controls are served on the kernel subshell while the cell runs",
        (
            Edit(
                "live/notebook_view.py",
                "controls = tuple(widget for panel in self.recorder.panels for widget in "
                "panel.controls)",
                "controls = tuple(panel.controls[0] for panel in self.recorder.panels[:3] "
                "if panel.controls)",
            ),
        ),
        (_PINGS,),
    ),
    Mutation(
        "panel-never-redrawn",
        "a panel with widgets of its own is redrawn at each refresh of the view",
        (Edit("live/notebook_view.py", "            panel.draw()\n", "            pass\n"),),
        (_PINGS,),
    ),
    Mutation(
        "panel-line-after-the-tabs",
        "a line under the plot goes right under it, above the tabs, whenever it appears",
        (
            Edit(
                "live/notebook_view.py",
                "at = sum(PLACES.index(other) <= rank for other in self._places)",
                "at = len(self._places)",
            ),
        ),
        (_NEW_LINE,),
    ),
    Mutation(
        "panel-built-line-left-out",
        "a widget a panel builds for a place is in the view from the start",
        (
            Edit(
                "live/notebook_view.py",
                "parts = [widget for place in PLACES for widget in built[place]]",
                'parts = [w for place in PLACES[:3] for w in built[place]] + built["tab"]',
            ),
        ),
        (_PINGS,),
    ),
    Mutation(
        "stop-hint-never-shown",
        "where clicks cannot be routed, the Stop button says how to stop mid-run",
        (
            Edit(
                "live/stop_button.py",
                'if self._view.routed is False and "hint" not in self._shown:',
                "if False:",
            ),
        ),
        (_PINGS,),
    ),
    Mutation(
        "png-footer-holds-every-summary",
        "the saved plot carries the lines shown under the live plot, not the summary line",
        (Edit("live/plot_widget.py", ' if panel.place == "line"]', "]"),),
        (_NEW_LINE,),
    ),
    Mutation(
        "headless-ending-line-dropped",
        "a run without a notebook ends with its [finished] or [stopped] progress line",
        (
            Edit(
                "live/summary.py",
                "        if self.ended is None or not (metrics.version or progress.count):",
                "        if True:",
            ),
        ),
        (
            "tests/test_live_panels.py::"
            "test_without_a_notebook_a_panel_builds_nothing_and_prints_its_line",
        ),
    ),
)
