"""Running cells in a real kernel through a jupyter_client, as a front end does."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
from jupyter_client.manager import start_new_kernel

from tests.processes import kernel_environment

Message = dict[str, Any]
TEMPLATE_MAIN = "notebook_kit.launch.template_process"


def is_template(process: psutil.Process) -> bool:
    """The kernel's clean template process, made at ``import notebook_kit``: not a launch's."""
    try:
        return TEMPLATE_MAIN in process.cmdline()
    except psutil.Error:
        return False


def launched_below(kernel_pid: int) -> list[psutil.Process]:
    """The kernel's descendants still running that a launch started: its template aside."""
    below = psutil.Process(kernel_pid).children(recursive=True)
    return [
        p
        for p in below
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and not is_template(p)
    ]


def cell_messages(
    client: Any,
    msg_id: str,
    timeout: float,
    on_message: Callable[[Message], None] | None = None,
) -> list[Message]:
    """The iopub messages of the request ``msg_id`` until the kernel is idle after it;
    ``on_message`` sees each one as it arrives."""
    messages, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = client.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(message)
        if on_message is not None:
            on_message(message)
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return messages
    raise AssertionError(f"the cell did not finish within {timeout:g} s (request {msg_id})")


def run_cell(client: Any, code: str, timeout: float = 60.0) -> list[Message]:
    """Execute ``code`` and return its iopub messages once the kernel is idle again."""
    return cell_messages(client, client.execute(code), timeout)


@contextlib.contextmanager
def real_kernel() -> Iterator[tuple[Any, Any]]:
    """A fresh ipykernel (this checkout importable) and its client; shut down afterwards."""
    manager, client = start_new_kernel(kernel_name="python3", env=kernel_environment())
    try:
        yield manager, client
    finally:
        templates = [p for p in _children(manager.provisioner.process.pid) if is_template(p)]
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        _reap_orphaned(templates)


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children()
    except psutil.Error:
        return []


def _reap_orphaned(processes: list[psutil.Process]) -> None:
    """Wait for the killed kernel's template to end (its socket to the kernel closed), and
    reap it where this process, a subreaper in tests that count what is left, adopted it."""
    deadline = time.monotonic() + 10.0
    for process in processes:
        while process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, f"the template {process.pid} outlived its kernel"
            time.sleep(0.05)
        with contextlib.suppress(ChildProcessError, psutil.Error):
            if process.ppid() == os.getpid():
                os.waitpid(process.pid, 0)
