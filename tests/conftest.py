"""Shared fixtures: an isolated saved default, Ctrl-C that always interrupts, and no process
left behind by a test."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.processes import child_subreaper, descendants, kill_and_reap


def _describe(process: psutil.Process) -> str:
    try:
        with process.oneshot():
            status, name = process.status(), process.name()
        if status == psutil.STATUS_ZOMBIE:
            return f"zombie {name}"
        return f"{status} {' '.join(process.cmdline())[:80]}"
    except psutil.Error:
        return "gone"


@pytest.fixture(autouse=True, scope="session")
def interrupts_raise_keyboard_interrupt():
    """Ctrl-C raises KeyboardInterrupt in tests, however this process was started.

    Started with SIGINT ignored (``nohup cmd &``, some CI runners), Python keeps it ignored,
    and so would every process the tests start: the interrupt tests would wait in vain.
    """
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def python_handles_ctrl_c():
    """Each test starts with Python's own Ctrl-C handler: a library may replace it when first
    imported (``dask_jobqueue.runner``, which the SLURM tests import, exits the process on
    Ctrl-C), and a test that interrupts a run expects KeyboardInterrupt."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


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
    """Fail the test if a process it started (zombie or alive) is still there afterwards.

    The census follows re-parented processes: for the test's duration this process is a child
    subreaper, so a grandchild whose parent died is adopted here instead of by init, and is
    seen. Whatever is left is killed and reaped after the census.
    """
    before = {child.pid for child in descendants()}
    with child_subreaper():
        yield
        deadline = time.monotonic() + 2.0
        while True:
            left = [child for child in descendants() if child.pid not in before]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        described = [(child.pid, _describe(child)) for child in left]
        kill_and_reap(left)
    assert not left, f"processes left behind: {described}"


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the saved default at a temporary file; the real ~/.config is never touched."""
    path = tmp_path / "config" / "launch.json"
    monkeypatch.setenv("NOTEBOOK_KIT_CONFIG", str(path))
    return path


# -- the summary: what kind of test passed, so the total does not flatter ------------------

_KINDS = {
    "browser": "browser (JupyterLab in Chromium)",
    "gpu": "GPU",
    "kernel": "real Jupyter kernel",
    "bite": "mutation check",
    "integration": "real processes",
}
_WORST_FIRST = ("failed", "error", "xpassed", "skipped", "xfailed", "passed")


_kind_of: dict[str, str] = {}  # node id -> kind, from each collected test's markers


def pytest_collection_finish(session):
    """Let the import warm-up finish before the first test.

    Importing the launcher starts a thread that imports what workers need, creating loggers
    as it goes; pytest's logging plugin walks the loggers as the run starts, and a dictionary
    changing under it is an internal error of the whole run.
    """
    warmup = sys.modules.get("notebook_kit.launch.warmup")
    if warmup is not None:
        warmup.wait_for_warmup()


def pytest_collection_modifyitems(config, items):
    for item in items:
        kind = next((kind for kind in _KINDS if item.get_closest_marker(kind)), "unit")
        _kind_of[item.nodeid] = kind


def _kind(report: pytest.TestReport) -> str:
    return _kind_of.get(report.nodeid, "unit")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Count the outcomes by kind of test: unit, real processes, kernel, browser, GPU."""
    worst: dict[str, tuple[int, str, str]] = {}
    for rank, outcome in enumerate(_WORST_FIRST):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            if nodeid and (nodeid not in worst or rank < worst[nodeid][0]):
                worst[nodeid] = (rank, outcome, _kind(report))
    if not worst:
        return
    terminalreporter.section("tests by kind")
    for kind, label in [*_KINDS.items(), ("unit", "unit and parametrized")][::-1]:
        outcomes = [outcome for _, outcome, k in worst.values() if k == kind]
        if outcomes:
            counts = ", ".join(f"{outcomes.count(o)} {o}" for o in _WORST_FIRST if o in outcomes)
            terminalreporter.write_line(f"{label}: {counts}")
