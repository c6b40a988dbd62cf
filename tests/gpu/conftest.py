"""GPU tests: each scenario runs in a fresh interpreter, as in a fresh kernel.

The test process itself never touches CUDA (a context here would make every later forked
test fail), so the GPUs are counted the way the launcher counts them, without initialising
CUDA; every test is skipped, with the reason, where none is visible.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from notebook_kit.config.environment import gpu_count

GPUS = gpu_count()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible to torch here)")
    for item in items:
        if "tests/gpu/" in item.nodeid.replace(os.sep, "/"):
            item.add_marker(pytest.mark.gpu)
            item.add_marker(pytest.mark.integration)
            if GPUS == 0:
                item.add_marker(skip)


def run_fresh(code: str, timeout: float = 240) -> str:
    """Run ``code`` in a new Python process (a fresh kernel) and return its stdout."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    environment.pop("PYTEST_CURRENT_TEST", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout
