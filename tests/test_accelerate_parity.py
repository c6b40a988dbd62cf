"""Accelerate's own test functions, run unchanged against notebook_kit (names rebound only).

Every public-API test function in ``accelerate/test_utils/scripts/`` (test_sync, test_ops,
test_distributed_data_loop, test_script, test_notebook) runs with our ``Accelerator``,
collectives, ``set_seed``, ``notebook_launcher``, ... bound in place of Accelerate's, on 1 process
and on 2 forked processes (see ``tests/accelerate_parity_cases.py`` for each call and for the
tests left out, with the reason). Ours must pass every test Accelerate 1.15.0 passes on CPU; the
record of what Accelerate passes is itself checked against Accelerate.

``python -m tests.accelerate_parity_runner`` prints the pass counts of both.
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "accelerate", reason="runs Accelerate's shipped test scripts; install the bench extra"
)

from tests.accelerate_parity_cases import (
    ACCELERATE_FAILS,
    CASES,
    ONE_IMPORT_CASES,
    OURS_FAILS,
    OUT_OF_SCOPE,
    RACY,
    bindings,
)
from tests.accelerate_parity_runner import Case, run_case

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _params() -> list:
    params = []
    for case in CASES:
        for processes in case.processes:
            marks = []
            if case.id in OUT_OF_SCOPE:
                marks.append(pytest.mark.skip(reason=f"out of scope: {OUT_OF_SCOPE[case.id]}"))
            params.append(pytest.param(case, processes, id=f"{case.id}[{processes}p]", marks=marks))
    return params


@pytest.mark.parametrize(("case", "processes"), _params())
def test_ours_passes(case: Case, processes: int):
    if (case.id, processes) in RACY:
        pytest.skip(f"the case's outcome varies: {RACY[case.id, processes]}")
    known = OURS_FAILS.get((case.id, processes))
    outcome = run_case(case, "ours", processes, bindings("ours"))
    if known is not None:
        assert outcome.status == "fail", f"passes now: remove it from OURS_FAILS ({known})"
        pytest.xfail(known)
    accelerate_fails = ACCELERATE_FAILS.get((case.id, processes))
    note = f" (Accelerate fails it too: {accelerate_fails})" if accelerate_fails else ""
    assert outcome.status == "pass", f"{outcome.detail}{note}"


_BY_ID = {case.id: case for case in CASES}


@pytest.mark.parametrize(
    ("case", "processes"),
    [pytest.param(_BY_ID[name], n, id=f"{name}[{n}p]") for name, n in ONE_IMPORT_CASES],
)
def test_ours_passes_with_accelerates_own_configuration_objects(case: Case, processes: int):
    """Only ``Accelerator`` (and the collectives) rebound: the script's DataLoaderConfiguration,
    GradientAccumulationPlugin and DistributedType stay Accelerate's."""
    outcome = run_case(case, "one-import", processes, bindings("one-import"))
    assert outcome.status == "pass", outcome.detail


@pytest.mark.parametrize(("case", "processes"), _params())
def test_record_of_what_accelerate_passes(case: Case, processes: int):
    """Accelerate passes exactly the cases not listed in ACCELERATE_FAILS."""
    if (case.id, processes) in RACY:  # its outcome would say nothing either way
        pytest.skip(f"the case's outcome varies: {RACY[case.id, processes]}")
    expected = "fail" if (case.id, processes) in ACCELERATE_FAILS else "pass"
    # A listed failure may be Accelerate's deadlock: a shorter wait is enough to see it.
    timeout = 30 if expected == "fail" else 120
    outcome = run_case(case, "accelerate", processes, bindings("accelerate"), timeout=timeout)
    assert outcome.status == expected, outcome.detail


def test_every_listed_case_exists():
    ids = {case.id for case in CASES}
    pairs = (*ACCELERATE_FAILS, *RACY, *OURS_FAILS)
    listed = set(OUT_OF_SCOPE) | {name for name, _ in pairs}
    assert listed <= ids, listed - ids
    assert len(ids) == len(CASES), "case ids are unique"
