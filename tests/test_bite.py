"""The suite bites: every deliberate breakage in ``tests/mutations.py`` is caught.

The full check runs ``python -m tests.bite`` two breakages at a time (about a quarter of an hour
on 2 cores; select it with ``-m bite``); that every breakage still applies is checked in a
second. It skips the check's own baseline run: the rest of the suite runs every guarding test
on the unbroken code, and fails if one does not pass there.
"""

from __future__ import annotations

import pytest

from tests import bite
from tests.mutations import MUTATIONS


def test_every_breakage_still_applies_to_the_code():
    assert bite.stale(MUTATIONS) == []
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS) >= 17


@pytest.mark.bite
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_breakage_is_caught_by_its_guarding_tests(capsys):
    status = bite.main(["--jobs", "2", "--no-baseline"])
    report = capsys.readouterr().out
    survivors = [
        line.strip()
        for line in report.splitlines()
        if line.lstrip().startswith(("survived", "stale", "error"))
    ]
    assert status == 0, "breakages the suite does not catch:\n" + "\n".join(survivors or [report])
