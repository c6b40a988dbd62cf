"""Launches from a kernel that cannot fork safely start their workers from a clean template.

A fresh Python process makes a gloo process group and launches: rank 0's result and the
weights come home, the banner says why, the template is reused and never outlives the process.
In this process (start method "template"): a failing rank is named, Stop reaches the ranks, a
template that died is replaced, and what cannot be shipped is named before anything starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch.distributed as dist

from notebook_kit import WorkerError, notebook_launcher, set_start_method, should_stop
from notebook_kit.launch import template, template_choice
from notebook_kit.launch.template_shipping import UnshippableError
from notebook_kit.live.observer import LaunchObserver
from tests.processes import clean_environment

pytestmark = pytest.mark.integration

# A script, as a notebook would run it: notebook_kit imported first, then a process group.
_SCRIPT = """\
import json, os, sys, time
import torch, torch.distributed as dist
from torch import nn
from notebook_kit import notebook_launcher
from notebook_kit.launch.template import template_pid
from notebook_kit.live.headless import ConsolePrinter

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = nn.Linear(3, 1)

def train(model, scale):
    import torch.distributed as d
    from notebook_kit import Accelerator
    Accelerator().prepare(model)  # a prepared model's weights go home
    with torch.no_grad():
        model.weight.fill_(scale * d.get_world_size())
    total = torch.tensor([1.0])
    d.all_reduce(total)
    if sys.argv[1] == "hold":
        print("workers up", flush=True)
        time.sleep(120)
    return {"world": d.get_world_size(), "sum": total.item(), "pid": os.getpid()}

first = notebook_launcher(train, args=(model, 5.0), num_processes=2, observer=ConsolePrinter())
pid = template_pid()
second = notebook_launcher(train, args=(model, 7.0), num_processes=2, observer=ConsolePrinter())
print("RESULT " + json.dumps({
    "first": first, "second": second, "weight": model.weight.tolist(),
    "template": pid, "template_again": template_pid(),
    "kernel_world": dist.get_world_size(),
}), flush=True)
"""


def _run_script(tmp_path, mode: str) -> subprocess.Popen:
    script = tmp_path / "launch.py"
    script.write_text(_SCRIPT)
    return subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_environment(tmp_path, NOTEBOOK_KIT_LIVE="no"),
    )


def _gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and not _zombie(p)]
        if not alive:
            return True
        time.sleep(0.05)
    return False


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_process_group_in_the_caller_launches_from_the_template_and_brings_weights_home(
    tmp_path,
):
    process = _run_script(tmp_path, "run")
    output, _ = process.communicate(timeout=180)
    assert process.returncode == 0, output
    banner = "The kernel holds a torch.distributed process group: starting workers from a clean"
    assert output.count(banner) == 2, output
    found = json.loads(output.split("RESULT ", 1)[1])
    # The workers made their own group of two: the caller's group of one stayed its own.
    assert found["first"]["world"] == found["second"]["world"] == 2
    assert found["first"]["sum"] == 2.0 and found["kernel_world"] == 1
    assert found["weight"] == [[14.0, 14.0, 14.0]]  # the second run's weights, home
    assert found["template"] and found["template"] == found["template_again"]  # reused
    assert _gone([found["template"]], within=10), "the template outlived its kernel"


def test_nothing_outlives_a_kernel_killed_during_a_template_launch(tmp_path):
    process = _run_script(tmp_path, "hold")
    assert process.stdout is not None
    lines = []
    for line in process.stdout:  # until both ranks run their function
        lines.append(line)
        if sum("workers up" in seen for seen in lines) == 2:
            break
    below = psutil.Process(process.pid).children(recursive=True)
    assert len(below) >= 4, "".join(lines)  # the template, the guardian and two workers
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert _gone([p.pid for p in below], within=10), "a process outlived the killed kernel"


@pytest.fixture(scope="module")
def from_template():
    set_start_method("template")
    try:
        yield
    finally:
        template_choice._chosen = None  # back to NOTEBOOK_KIT_START_METHOD, as later tests set it
        template.end_template()  # a later module's count of this process's children is its own


class _PressStop(LaunchObserver):
    def on_start(self, info):
        threading.Timer(0.5, info.stop_flag.set).start()


def _until_stopped():
    deadline = time.monotonic() + 20
    while not should_stop():
        assert time.monotonic() < deadline, "Stop never reached the rank"
        time.sleep(0.02)
    return f"stopped at rank {dist.get_rank()}"


def _fails_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("rank one is broken")
    dist.barrier()


def _fails_once(marker):
    if not os.path.exists(marker):
        dist.barrier()
        if dist.get_rank() == 1:
            open(marker, "w").close()
            raise ValueError("the first attempt fails")
        dist.barrier()
    return "second attempt"


def _ours(before: set[int]) -> list[psutil.Process]:
    """The live processes below this one that were not there before the test (an earlier
    test's cluster may still be ending its own)."""
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in before and not _zombie(p.pid)
    ]


def test_failures_stop_and_a_dead_template_behave_as_in_a_forked_launch(from_template, tmp_path):
    before = {p.pid for p in psutil.Process().children(recursive=True)} - {template.template_pid()}
    with pytest.raises(WorkerError, match="rank 1") as failed:
        notebook_launcher(_fails_on_rank_1, num_processes=2)
    assert "rank one is broken" in str(failed.value)
    marker = str(tmp_path / "failed-once")
    assert notebook_launcher(_fails_once, args=(marker,), num_processes=2, max_restarts=1) == (
        "second attempt"
    )
    assert notebook_launcher(_until_stopped, num_processes=2, observer=_PressStop()) == (
        "stopped at rank 0"
    )
    first = template.template_pid()
    assert first is not None
    below = [p.pid for p in _ours(before)]
    assert below == [first], "a launch returned before its guardian was gone"
    os.kill(first, signal.SIGKILL)  # a template that died is replaced by the next launch
    assert _gone([first], within=5)
    assert notebook_launcher(dist.get_world_size, num_processes=2) == 2
    assert template.template_pid() not in (None, first)
    # What the killed template had below it may take a moment to exit once orphaned.
    deadline = time.monotonic() + 10
    while True:
        left = [p for p in _ours(before) if p.pid != first]
        if [p.pid for p in left] == [template.template_pid()] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [p.pid for p in left] == [template.template_pid()], (
        "a launch left a process",
        [(p.pid, p.name(), p.cmdline()[:4]) for p in left if p.is_running()],
    )


def test_what_cannot_be_shipped_is_named_before_anything_starts(from_template, tmp_path):
    log = open(tmp_path / "log.txt", "w")  # noqa: SIM115 - the open file is the point
    lock = threading.Lock()

    def writes(line):
        with lock:
            log.write(line)

    children = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(UnshippableError, match=r"the variable 'lock' of its closure \(lock\)"):
        notebook_launcher(writes, args=("x",), num_processes=2)
    with pytest.raises(UnshippableError, match=r"args\[0\] \(TextIOWrapper\).*file's path"):
        notebook_launcher(print, args=(log,), num_processes=2)
    log.close()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children


def test_a_bad_start_method_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="start_method must be one of 'auto', 'fork', 'template'"):
        set_start_method("spawn")
