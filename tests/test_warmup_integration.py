"""The workers' one-time imports are paid once in the kernel, not at every launch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

PROBE = """
import sys, time
from notebook_kit import notebook_launcher
from notebook_kit.launch.warmup import WARM_MODULES

def inherited():
    return [name for name in WARM_MODULES if name in sys.modules]

# Launched at once, while the background imports may still run: the fork waits for them.
first = notebook_launcher(inherited, num_processes=2, live=False)
second = notebook_launcher(inherited, num_processes=2, live=False)
print(first == second == list(WARM_MODULES))
"""


def test_forked_workers_inherit_the_warm_modules_even_when_launched_at_once():
    environment = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180, env=environment
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True"
