"""Deliberate breakages of exported scripts.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_EXPORT_RUN = "tests/test_export_integration.py::"
_NOTEBOOK_RUN = (
    _EXPORT_RUN
    + "test_every_example_notebook_exports_to_a_script_that_runs_on_two_nodes_or_is_refused"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "script-output-writes-lines-in-pieces",
        "processes sharing one pipe write each line whole, so no other process splits it",
        (
            Edit(
                "cli/script_entry.py",
                "(self._pending + text).rpartition(",
                "(text, '', '') or (self._pending + text).rpartition(",
            ),
        ),
        ("tests/test_export.py::test_a_script_process_writes_each_printed_line_in_one_piece",),
    ),
    Mutation(
        "export-main-output-left-quiet",
        "An exported script's launched function prints on every rank; the notebook's own "
        "code prints once per node",
        (
            Edit(
                "cli/script_entry.py",
                "        if self._once_per_node and current_launch() is None:\n",
                "        if True:\n",
            ),
        ),
        (_EXPORT_RUN + "test_the_launched_function_prints_on_every_process",),
    ),
    Mutation(
        "export-group-joined-at-the-launch",
        "An exported script joins the job's group before its cells, so they can make a "
        "temporary folder once for the job",
        (
            Edit(
                "cli/script_entry.py",
                "    if place is None or place.world_size == 1 or dist.is_initialized():\n",
                "    if True:\n",
            ),
        ),
        (_NOTEBOOK_RUN + "[04_checkpoint_resume.ipynb]",),
    ),
    Mutation(
        "export-temporary-folder-per-process",
        "A temporary folder the notebook's cells make is made once for the exported job",
        (
            Edit(
                "cli/script_entry.py",
                "    if not dist.is_initialized() or dist.get_world_size() == 1:\n",
                "    if True:\n",
            ),
        ),
        (_NOTEBOOK_RUN + "[04_checkpoint_resume.ipynb]",),
    ),
)
