"""Pools in a process that cannot fork safely start their workers from the clean template.

In this process, with the start method "fork": a pool is refused before anything starts, with
the hint that "auto" would work. In a fresh process holding a gloo process group (as a
notebook would): a function defined in ``__main__`` runs as the first command, Stop reaches
the ranks through the memory both sides map, a value that cannot be sent is named with the
fix, a restart of a pool made with "fork" is refused with the workers kept, one with "auto"
starts new workers from the template, and nothing outlives the process, a pool left open included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest
import torch.distributed as dist

from notebook_kit import WorkerPool
from notebook_kit.launch.preflight import ForkSafetyError
from tests.processes import clean_environment

_SCRIPT = """\
import json, os, threading, time
import psutil, torch.distributed as dist
from notebook_kit import WorkerPool, should_stop
from notebook_kit.launch.template import template_pid
from notebook_kit.launch.template_shipping import UnshippableError

forked = WorkerPool(num_processes=2, live=False, start_method="fork")  # while it is safe
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
kept = forked.pids
try:  # "fork" is kept for the pool's life: refused before its workers are stopped
    forked.restart()
except Exception as error:
    found = {"refused": [type(error).__name__, forked.pids == kept, str(error)]}
forked.close()
pool = WorkerPool(num_processes=2, live=False)
found["where"] = pool.where

def ranks_and_builtins():  # the workers' __main__ is their own: builtins, no template names
    return dist.get_rank(), len("abc"), "_serve" in globals()

found["first"] = pool.run(ranks_and_builtins, ranks="all")

def until_stopped():  # bounded: a Stop that never arrives fails the test, never hangs it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if should_stop():
            return "stopped"
        time.sleep(0.01)
    return "never stopped"

pressing = threading.Event()
def press_stop():  # as the Stop button does, until the command has seen it
    while not pressing.wait(0.1):
        pool._stop_flag.set()
threading.Thread(target=press_stop, daemon=True).start()
found["stop"] = pool.run(until_stopped, ranks="all")
pressing.set()

guard = threading.Lock()
def uses_the_lock():
    with guard:
        return 1
try:
    pool.run(uses_the_lock)
except UnshippableError as error:
    found["unshippable"] = str(error)

first = pool.pids
pool.restart()
found["restarted"] = [pool.pids != first, pool.run_cell("dist.get_world_size()")]
template = template_pid()
pool.close()
time.sleep(0.5)
below = psutil.Process().children(recursive=True)
found["below"] = [p.pid for p in below if p.status() != psutil.STATUS_ZOMBIE]
found["template"] = template
found["left_running"] = WorkerPool(num_processes=2, live=False).pids  # the exit ends them
print("RESULT " + json.dumps(found), flush=True)
"""


def test_the_fork_start_method_refuses_a_pool_in_an_unsafe_process_with_the_hint(monkeypatch):
    monkeypatch.setenv("NOTEBOOK_KIT_START_METHOD", "fork")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ForkSafetyError, match="with 'auto' the workers would start from"):
            WorkerPool(num_processes=2, live=False)
    finally:
        dist.destroy_process_group()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


@pytest.mark.integration
def test_a_pool_in_a_process_holding_a_process_group_works_from_the_template(tmp_path):
    script = tmp_path / "pool_script.py"
    script.write_text(_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=80,  # a hang it causes fails here, saying so, before pytest-timeout
        env=clean_environment(tmp_path, PYTHONPATH=os.getcwd()),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    found = json.loads(line.removeprefix("RESULT "))
    assert "process group: starting workers from a clean process" in found["where"]
    assert found["first"] == [[0, 3, False], [1, 3, False]]
    assert found["stop"] == ["stopped", "stopped"]
    unshippable = found["unshippable"]
    assert "`guard` (lock)" in unshippable and "Create the lock inside" in unshippable
    refused, kept, words = found["refused"]
    assert refused == "ForkSafetyError" and kept, found["refused"]
    assert "with 'auto' the workers would start from a clean process" in words
    assert found["restarted"] == [True, 2]
    assert found["below"] == [found["template"]], "close left a worker or guardian behind"
    deadline = time.monotonic() + 10  # the template ends with the process that started it
    for pid in [found["template"], *found["left_running"]]:  # and so does a pool left open
        while not _gone(pid):
            assert time.monotonic() < deadline, f"process {pid} outlived the process that made it"
            time.sleep(0.05)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
