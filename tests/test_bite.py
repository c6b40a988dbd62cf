"""The suite bites: every deliberate breakage in ``tests/mutations.py`` is caught.

That every breakage still applies is checked in a second. Running them is slower: each one
copies the package, breaks it and runs its guarding tests, about half an hour for all of them on 2
cores. So each run of the suite runs one sixteenth of them, two at a time: the sixteenth is
chosen by the checked-out commit, so the same commit always runs the same breakages, and a
few commits in a row cover them all. ``NOTEBOOK_KIT_BITE=all`` runs every breakage
(``python -m tests.bite`` does too); select the check with ``-m bite``. It skips the check's own
baseline run: the rest of the suite runs every guarding test on the unbroken code, and fails if
one does not pass there.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess

import pytest

from tests import bite
from tests.mutations import MUTATIONS

PARTS = 16


def this_runs_breakages() -> list[str]:
    """The names of the breakages this run checks: a sixteenth chosen by the commit, or all."""
    names = [mutation.name for mutation in MUTATIONS if _guards_can_run(mutation)]
    if os.environ.get("NOTEBOOK_KIT_BITE") == "all":
        return names
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=bite.ROOT, capture_output=True, text=True
    )
    commit = done.stdout.strip() if done.returncode == 0 else ""
    part = int(commit[:8], 16) % PARTS if commit else 0
    return names[part::PARTS]


_OPTIONAL_GUARDS = {  # guarding tests that skip without these packages
    "test_object_storage_integration": ("s3fs", "moto"),
    "test_ray_integration": ("ray",),
}


def _guards_can_run(mutation) -> bool:
    """False for a breakage only tests of an optional part guard (the S3 tests, the Ray
    tests) where that part is not installed: they skip there, so it could not be caught."""
    for module, packages in _OPTIONAL_GUARDS.items():
        installed = all(importlib.util.find_spec(name) for name in packages)
        if not installed and all(module in test for test in mutation.tests):
            return False
    return True


def test_every_breakage_still_applies_to_the_code():
    assert bite.stale(MUTATIONS) == []
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS) >= 17


def test_every_guarding_test_exists():
    assert bite.missing_tests(MUTATIONS) == []


_HANGS = """
import time
import pytest

@pytest.mark.timeout(1)
def test_hangs():
    time.sleep(30)

def test_fails():
    assert False
"""


@pytest.mark.integration
def test_a_test_ended_by_pytest_timeout_is_told_apart_from_a_failure(tmp_path):
    (tmp_path / "test_hangs.py").write_text(_HANGS)
    status, output, timed_out = bite.run_tests(tmp_path, ["test_hangs.py::test_hangs"])
    assert (status, timed_out) == (1, True), output  # exit status 1, as a failure's
    status, output, timed_out = bite.run_tests(tmp_path, ["test_hangs.py::test_fails"])
    assert (status, timed_out) == (1, False), output


@pytest.mark.bite
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_every_breakage_is_caught_by_its_guarding_tests(capsys):
    names = this_runs_breakages()
    print(f"checking {len(names)} of {len(MUTATIONS)} breakages")
    status = bite.main(["--jobs", "2", "--no-baseline", *names])
    report = capsys.readouterr().out
    survivors = [
        line.strip()
        for line in report.splitlines()
        if line.lstrip().startswith(("survived", "timeout", "stale", "error"))
    ]
    assert status == 0, "breakages the suite does not catch:\n" + "\n".join(survivors or [report])
