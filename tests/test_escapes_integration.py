"""Nothing started during a launch outlives it, however the launch or its kernel ends.

Each case runs a fresh kernel process whose 2 workers start a ``sleep`` in their own process
group, one in a new session, an orphaned one (its parent exits at once) and 2 DataLoader
workers. ``python -m benchmarks.escapes --runs 30`` repeats these cases many times.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # benchmarks/ is a folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks.escapes import VARIANTS, run_variant  # noqa: E402

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("no_leftover_processes"),
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_process_outlives_the_launch(variant):
    # finish/fail: counted the moment the launch returns; kills: 3 s after the kill.
    result = run_variant(variant, grace=3.0)
    assert result.recorded >= 2 * 5  # the workers really started their processes
    assert result.survivors == [], f"{len(result.survivors)} of {result.recorded} survived"
