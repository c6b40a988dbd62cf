"""A real kernel that made a process group runs a pool and ``%%distributed`` cells from its
clean template process.

One kernel for the module, one pool in it (the default pool of ``%%distributed``): the start
line says which way the workers started and why; state stays across cells; ``--ranks``,
``--out``, ``--local`` and ``--noblock`` work; an edited module reaches the warm workers; a
failing rank is named and the workers keep running; weights come home into the kernel's model;
an interrupt (SIGINT to the kernel's process group) ends a command with one KeyboardInterrupt and
the same workers serve the next cell; closing the pool leaves nothing below the kernel but its
template, which ends with the kernel.
"""

from __future__ import annotations

import ast
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.kernel_cells import cell_messages, real_kernel, run_cell

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

SETUP = """\
%load_ext notebook_kit
import sys, torch, torch.distributed as dist
from torch import nn
from notebook_kit import Accelerator
from notebook_kit.launch.template import template_pid
sys.path.insert(0, {folder!r})
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = nn.Linear(2, 1)

def train(model):
    Accelerator().prepare(model)
    with torch.no_grad():
        model.weight.fill_(dist.get_world_size() + 1.0)
    return dist.get_rank()
"""
START = """\
%%distributed -n 2
import os, time, torch.distributed as dist
import edited
rank = dist.get_rank()
state = rank + 40
(os.getpid(), edited.VALUE)"""
POOL = "pool = get_ipython().find_cell_magic('distributed').__self__.default_pool"


def _text(messages: list[dict]) -> str:
    return "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")


def _errors(messages: list[dict]) -> list[dict]:
    return [m["content"] for m in messages if m["msg_type"] == "error"]


def _value(messages: list[dict]) -> Any:
    (result,) = [m for m in messages if m["msg_type"] == "execute_result"]
    return ast.literal_eval(result["content"]["data"]["text/plain"])


def _running_below(pid: int) -> list[int]:
    below = psutil.Process(pid).children(recursive=True)
    return sorted(p.pid for p in below if p.is_running() and p.status() != psutil.STATUS_ZOMBIE)


def _wait_for(condition: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


class Kernel:
    def __init__(self, manager: Any, client: Any) -> None:
        self.manager, self.client = manager, client
        self.pid = manager.provisioner.process.pid

    def run(self, code: str, timeout: float = 120.0) -> list[dict]:
        return run_cell(self.client, code, timeout)

    def value(self, code: str, timeout: float = 120.0) -> Any:
        messages = self.run(code, timeout)
        assert not _errors(messages), _errors(messages)
        return _value(messages)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """The kernel, its default pool started (``started``: that cell's messages); at the end,
    closing the pool leaves nothing below the kernel but its template, which ends with it."""
    folder = tmp_path_factory.mktemp("edited")
    (folder / "edited.py").write_text("VALUE = 'old'\n")
    with real_kernel() as (manager, client):
        shell = Kernel(manager, client)
        shell.folder = folder
        assert not _errors(shell.run(SETUP.format(folder=str(folder)), timeout=120))
        shell.started = shell.run(START, timeout=240)
        assert not _errors(shell.run(POOL))
        shell.workers = shell.value("pool.pids")
        yield shell
        template = shell.value("template_pid()")
        assert not _errors(shell.run("%distributed close"))
        _wait_for(lambda: _running_below(shell.pid) == [template], 10, "workers outlived close")
        assert not any(_alive(pid) for pid in shell.workers)
    _wait_for(lambda: not _alive(template), 10, "the template outlived its kernel")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_cells_run_on_warm_workers_started_from_the_template_with_every_option(kernel):
    started = kernel.started
    assert not _errors(started), _errors(started)
    line = "The kernel holds a torch.distributed process group: starting workers from a clean"
    assert line in _text(started), _text(started)
    pid, value = _value(started)
    assert value == "old" and pid != kernel.pid

    assert not _errors(kernel.run("%%distributed --ranks 1 --out seen\nbumped = state + 1\nbumped"))
    assert kernel.value("seen") == {1: 42}
    kernel.run("%%distributed --out ran\n'bumped' in globals()")
    assert kernel.value("ran") == {0: False, 1: True}, "--ranks 1 ran on rank 0"
    kernel.run("%%distributed --local\nworld = dist.get_world_size()")
    assert kernel.value("world") == 1  # the kernel's own group ran the cell after the ranks
    kernel.run("%%distributed --noblock\ntime.sleep(0.5)\nstate * 2")
    assert kernel.value("_.result(timeout=60), _.results()") == (80, {0: 80, 1: 82})

    (kernel.folder / "edited.py").write_text("VALUE = 'new'\n")
    kernel.run("%%distributed --out after\n(state, world, os.getpid(), edited.VALUE)")
    after = kernel.value("after")
    assert after[0][:2] == (40, 2) and after[1][:2] == (41, 2), after
    assert after[0][2] == pid and after[0][3] == "new", "the same workers, with the new code"


def test_a_failing_rank_is_named_and_weights_come_home_into_the_kernels_model(kernel):
    failed = _errors(kernel.run("%%distributed\nif rank == 1:\n    raise ValueError('one broke')"))
    assert len(failed) == 1 and "Rank 1 of 2" in failed[0]["evalue"], failed
    assert "one broke" in failed[0]["evalue"]
    assert kernel.value("pool.run(train, model), model.weight.tolist()") == (0, [[3.0, 3.0]])
    assert kernel.value("%%distributed --out kept\nstate") == 40
    assert kernel.value("kept") == {0: 40, 1: 41}


def test_an_interrupt_ends_the_command_once_and_the_pool_keeps_its_workers(kernel):
    spin = "%%distributed\nprint('spinning', flush=True)\nwhile True:\n    time.sleep(0.01)"
    busy = kernel.client.execute(spin)  # Python code: the interrupt reaches it between sleeps
    _until_printed(kernel.client, busy, "spinning", 60)
    interrupted = time.monotonic()
    group = os.getpgid(kernel.pid)
    assert group != os.getpgrp(), "the kernel must have a process group of its own"
    os.killpg(group, signal.SIGINT)  # Ctrl-C, as the front end sends it: to the kernel's group
    ended = cell_messages(kernel.client, busy, timeout=30)
    assert [e["ename"] for e in _errors(ended)] == ["KeyboardInterrupt"], _errors(ended)
    assert time.monotonic() - interrupted < 15
    assert kernel.value("%%distributed --out again\nstate") == 40
    assert kernel.value("again") == {0: 40, 1: 41}
    assert kernel.value("pool.pids") == kernel.workers, "the interrupt must not cost the workers"


def _until_printed(client: Any, msg_id: str, text: str, within: float) -> None:
    """Read the cell's messages until its workers printed ``text``."""
    printed, deadline = "", time.monotonic() + within
    while text not in printed:
        assert time.monotonic() < deadline, f"the cell never printed {text!r}"
        message = client.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
        if message["parent_header"].get("msg_id") == msg_id:
            printed += message["content"].get("text", "")
