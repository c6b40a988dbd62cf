"""Deliberate breakages of exported scripts.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_EXPORT_RUN = "tests/test_export_integration.py::"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "export-main-output-left-quiet",
        "An exported script's launched function prints on every rank; only the cells above "
        "the launch print once per node",
        (
            Edit(
                "cli/export.py",
                "        parts += [_QUIET_FUNCTION, *texts, _QUIET_END] if texts else []\n",
                "        parts += [_QUIET_FUNCTION, *texts] if texts else []\n",
            ),
        ),
        (_EXPORT_RUN + "test_the_launched_function_prints_on_every_process",),
    ),
)
