"""The clean template is made at ``import notebook_kit`` in a kernel, and only there.

A real kernel: a process it forked imports notebook_kit and starts none; the kernel's own
import starts one, as its child in a session of its own, before any launch; a launch's worker
starts none; the launch that needs it (a process group in the kernel) adopts that very process,
and its workers run at the kernel's priority, not the template's imports'. A kernel whose start
method is "fork" (the opt-out) starts none at import, and a launch's start_method="template"
still wins over that variable. A plain interpreter's import starts none.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest
from jupyter_client.manager import start_new_kernel

from tests.kernel_cells import is_template, run_cell
from tests.processes import kernel_environment

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

FORKED_CHILD_IMPORTS = """\
import os, sys
reader, writer = os.pipe()
child = os.fork()
if child == 0:
    import notebook_kit
    from notebook_kit.launch import template_start
    os.write(writer, repr(template_start.early_template_pid()).encode())
    os._exit(0)
os.close(writer)
os.waitpid(child, 0)
print("child:", os.read(reader, 100).decode())
"""

IMPORT = """\
import time
started = time.perf_counter()
import notebook_kit
print(f"import: {time.perf_counter() - started:.3f}")
from notebook_kit.launch import template_start
[template_start.early_template_pid()]
"""

LAUNCH = """\
import os, torch.distributed as dist
from notebook_kit import notebook_launcher
from notebook_kit.launch import template_start
from notebook_kit.launch.template import template_pid
from notebook_kit.live.headless import ConsolePrinter

def worker():
    template_start._early = None  # as if nothing were made: a worker still starts none
    started = template_start.start_at_import(lambda: "auto")
    return started, os.getpriority(os.PRIO_PROCESS, 0)

safe = notebook_launcher(worker, num_processes=2, observer=ConsolePrinter())
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
clean = notebook_launcher(worker, num_processes=2, observer=ConsolePrinter())
safe, clean, template_pid()
"""


def _text(messages: list[dict]) -> str:
    return "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")


def _value(messages: list[dict]) -> Any:
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert not errors, errors
    (result,) = [m for m in messages if m["msg_type"] == "execute_result"]
    return ast.literal_eval(result["content"]["data"]["text/plain"])


def _templates(kernel: int) -> list[int]:
    return [p.pid for p in psutil.Process(kernel).children() if is_template(p)]


def test_a_kernel_makes_its_template_at_import_and_its_launch_adopts_it():
    manager, client = start_new_kernel(kernel_name="python3", env=kernel_environment())
    try:
        kernel = manager.provisioner.process.pid
        forked = _text(run_cell(client, FORKED_CHILD_IMPORTS))
        assert "child: None" in forked, forked  # not the kernel's own process
        assert _templates(kernel) == []
        imported = run_cell(client, IMPORT)
        (early,) = _value(imported)
        assert _templates(kernel) == [early], _text(imported)
        assert os.getsid(early) == early != os.getsid(kernel)  # the kernel's ^C is not its
        ran = run_cell(client, LAUNCH, timeout=180)
        safe, clean, adopted = _value(ran)
        assert safe == (False, 0) and clean == (False, 0), _text(ran)
        assert "starting workers from a clean process" in _text(ran)
        assert adopted == early and _templates(kernel) == [early]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(early) and psutil.Process(early).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the template outlived its kernel"
        time.sleep(0.05)


def test_start_method_fork_opts_out_and_a_launch_keyword_still_wins():
    env = {**kernel_environment(), "NOTEBOOK_KIT_START_METHOD": "fork"}
    manager, client = start_new_kernel(kernel_name="python3", env=env)
    try:
        kernel = manager.provisioner.process.pid
        assert _value(run_cell(client, IMPORT)) == [None]
        assert _templates(kernel) == []
        keyword = (
            "from notebook_kit import notebook_launcher\n"
            "from notebook_kit.live.headless import ConsolePrinter\n"
            "notebook_launcher(lambda: 7, num_processes=2, start_method='template', "
            "observer=ConsolePrinter())"
        )
        ran = run_cell(client, keyword, timeout=180)
        assert _value(ran) == 7
        assert "The start method is 'template': starting workers from a clean" in _text(ran)
        assert len(_templates(kernel)) == 1
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_plain_interpreter_starts_no_template_at_import():
    code = (
        "import psutil, notebook_kit\n"
        "from notebook_kit.launch import template_start\n"
        "print(template_start.early_template_pid(), psutil.Process().children())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None []", out
