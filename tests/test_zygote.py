"""The zygote: real processes forked from a real zygote (torch imported once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from notebook_kit.node.zygote import Zygote, ZygoteChild, ZygoteError

ROOT = str(Path(__file__).resolve().parent.parent)
ENV = {**os.environ, "PYTHONPATH": ROOT}


@pytest.fixture(scope="module")
def zygote():
    zygote = Zygote(ENV)
    yield zygote
    zygote.close()


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _sleeping(path: str, **options) -> ZygoteChild:
    read, write = os.pipe()
    try:
        child = ZygoteChild(path, "tests.zygote_targets:sleep", [write], ENV, **options)
    finally:
        os.close(write)
    assert os.read(read, 16) == b"sleeping"
    os.close(read)
    return child


def test_a_child_runs_its_target_with_its_environment_streams_and_the_preloaded_torch(
    zygote, capfd
):
    read, write = os.pipe()
    child = ZygoteChild(
        zygote.path, "tests.zygote_targets:report", [write], {**ENV, "ZYGOTE_TEST": "set"},
        name="nk-test",
    )  # fmt: skip
    os.close(write)
    seen = os.read(read, 256).decode()
    os.close(read)
    assert child.wait(30) == 3
    assert seen == f"set {zygote.process.pid} True"
    assert "a line from the child" in capfd.readouterr().out


def test_signals_reach_the_child_through_the_zygote_and_its_status_comes_back(zygote):
    child = _sleeping(zygote.path, name="nk-test")
    assert psutil.Process(child.pid).name() == "nk-test"
    assert child.poll() is None
    child.send_signal(signal.SIGTERM)
    assert child.wait(10) == -signal.SIGTERM
    assert child.poll() == -signal.SIGTERM
    child.kill()  # after the end: nothing to signal, and no error


def test_poll_alone_reads_the_end_of_a_child(zygote):
    child = _sleeping(zygote.path)
    child.kill()
    deadline = time.monotonic() + 10
    while child.poll() is None and time.monotonic() < deadline:  # as a node task watches it
        time.sleep(0.02)
    assert child.poll() == -signal.SIGKILL


def test_sigint_and_sigterm_to_the_zygote_leave_it_serving(zygote):
    for signum in (signal.SIGINT, signal.SIGTERM):
        os.kill(zygote.process.pid, signum)
    time.sleep(0.2)
    assert zygote.alive()
    child = _sleeping(zygote.path)
    child.kill()
    assert child.wait(10) == -signal.SIGKILL


def test_a_child_whose_starter_died_is_killed(zygote):
    """The starter's connection is the child's lifeline, as PR_SET_PDEATHSIG was."""
    starter = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            import os, sys
            sys.path.insert(0, {ROOT!r})
            from tests.test_zygote import ENV, _sleeping
            print(_sleeping({zygote.path!r}).pid, flush=True)
            os.kill(os.getpid(), 9)
        """)],
        capture_output=True, text=True, timeout=60, env=ENV,
    )  # fmt: skip
    assert starter.returncode == -signal.SIGKILL, starter.stderr
    assert _gone(int(starter.stdout)), "the child outlived its starter"
    assert zygote.alive()


def test_the_zygote_ends_with_its_owner_and_takes_its_children():
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            sys.path.insert(0, {ROOT!r})
            from notebook_kit.node.zygote import Zygote
            from tests.test_zygote import ENV, _sleeping
            zygote = Zygote(ENV, preload=())
            print(zygote.process.pid, _sleeping(zygote.path).pid, zygote.path, flush=True)
            time.sleep(300)
        """)],
        stdout=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    try:
        zygote_pid, child_pid, path = owner.stdout.readline().split()
    finally:
        owner.kill()
        owner.wait()
    assert _gone(int(child_pid)), "the child outlived the zygote's owner"
    assert _gone(int(zygote_pid)), "the zygote outlived its owner"
    assert not os.path.exists(os.path.dirname(path)), "its socket's folder was left"


def test_a_dead_zygote_is_a_clear_error_and_its_children_read_as_killed():
    zygote = Zygote(ENV, preload=())
    child = _sleeping(zygote.path)
    zygote.process.kill()
    zygote.process.wait()
    assert child.wait(10) == -signal.SIGKILL
    assert _gone(child.pid)
    with pytest.raises(ZygoteError, match="did not start the child"):
        ZygoteChild(zygote.path, "tests.zygote_targets:sleep", [], ENV)
    zygote.close()
    assert not os.path.exists(zygote.path)
