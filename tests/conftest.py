"""Shared fixtures: every test that forks workers must leave no process behind."""

from __future__ import annotations

import os
import time

import psutil
import pytest


def _children() -> list[psutil.Process]:
    return [child for child in psutil.Process().children(recursive=True) if _alive(child)]


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(autouse=True, scope="session")
def isolated_saved_config(tmp_path_factory):
    """Point the saved default config at an empty place, so a developer's own never applies."""
    path = tmp_path_factory.mktemp("config") / "launch.json"
    previous = os.environ.get("NOTEBOOK_KIT_CONFIG")
    os.environ["NOTEBOOK_KIT_CONFIG"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("NOTEBOOK_KIT_CONFIG", None)
    else:
        os.environ["NOTEBOOK_KIT_CONFIG"] = previous


@pytest.fixture
def no_leftover_processes():
    """Fail the test if it leaves a child process (zombie or alive) behind."""
    before = {child.pid for child in _children()}
    yield
    deadline = time.monotonic() + 2.0
    while True:
        left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"processes left behind: {[(c.pid, c.status()) for c in left]}"


def kernel_environment() -> dict[str, str]:
    """Environment for a Jupyter kernel started by a test.

    ipykernel stops forwarding fd-level output when PYTEST_CURRENT_TEST is set.
    """
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env
