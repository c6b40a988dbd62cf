"""A real kernel that made a process group launches from its clean template process.

One kernel for the module: the banner says which way the workers started and why, rank 0's
result and weights come home, a failing rank is named, an interrupt ends the launch with
nothing left below the kernel but its template, and the template ends with the kernel.
"""

from __future__ import annotations

import time

import psutil
import pytest

from tests.kernel_cells import cell_messages, real_kernel, run_cell

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

SETUP = """\
import os, time, torch, torch.distributed as dist
from torch import nn
from notebook_kit import Accelerator, notebook_launcher
from notebook_kit.launch.template import template_pid
from notebook_kit.live.headless import ConsolePrinter

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = nn.Linear(2, 1)

def train(model, fail_on=None, hold=False):
    Accelerator().prepare(model)
    with torch.no_grad():
        model.weight.fill_(3.0)
    if dist.get_rank() == fail_on:
        raise RuntimeError(f"rank {dist.get_rank()} gave up")
    if hold:
        print("holding", flush=True)
        time.sleep(120)
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    return total.item()
"""

LAUNCH = "notebook_launcher(train, args=(model,{}), num_processes=2, observer=ConsolePrinter())"


def _text(messages: list[dict]) -> str:
    return "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")


def _result(messages: list[dict]) -> str:
    (result,) = [m for m in messages if m["msg_type"] == "execute_result"]
    return result["content"]["data"]["text/plain"]


def _errors(messages: list[dict]) -> list[dict]:
    return [m["content"] for m in messages if m["msg_type"] == "error"]


def _running_below(pid: int) -> list[int]:
    below = psutil.Process(pid).children(recursive=True)
    return [p.pid for p in below if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _wait_for(condition, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_kernel_holding_a_process_group_launches_from_its_template():
    with real_kernel() as (manager, client):
        kernel = manager.provisioner.process.pid
        assert not _errors(run_cell(client, SETUP, timeout=120))
        ran = run_cell(client, LAUNCH.format("") + "\n", timeout=180)
        banner = "The kernel holds a torch.distributed process group: starting workers from a clean"
        assert banner in _text(ran) and _result(ran) == "2.0", ran
        home = run_cell(client, "model.weight.tolist(), dist.get_world_size(), template_pid()")
        weights, world, template = eval(_result(home))
        assert weights == [[3.0, 3.0]] and world == 1, "the weights did not come home"
        assert _running_below(kernel) == [template]

        failed = _errors(run_cell(client, LAUNCH.format(" 1"), timeout=120))
        assert [e["ename"] for e in failed] == ["WorkerError"], failed
        assert "rank 1" in failed[0]["evalue"] and "rank 1 gave up" in failed[0]["evalue"]

        held = client.execute(LAUNCH.format(" None, True"))
        _wait_for(lambda: len(_running_below(kernel)) >= 4, 60, "the workers never started")
        interrupted = time.monotonic()
        manager.interrupt_kernel()
        stopped = cell_messages(client, held, timeout=30)
        assert [e["ename"] for e in _errors(stopped)] == ["KeyboardInterrupt"]
        _wait_for(lambda: _running_below(kernel) == [template], 5, "workers outlived Ctrl-C")
        assert time.monotonic() - interrupted < 5
        again = run_cell(client, LAUNCH.format(""), timeout=120)
        assert _result(again) == "2.0", again
    _wait_for(lambda: not psutil.pid_exists(template) or _zombie(template), 10, "template left")


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
