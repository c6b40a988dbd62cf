"""``notebook_kit.stacks()`` in a real kernel, from a second cell thread while a launch runs.

The test plays a front end that runs cells in a subshell (ipykernel 7's cell threads, which
JupyterLab's consoles use): the main shell runs a launch (blocking, or awaited) whose rank 0
sleeps and whose rank 1 waits in ``dist.all_reduce``; cells in a subshell ask for the stacks
until both ranks are named. Then the kernel is interrupted as the stop button does (SIGINT to
its process group): the launch ends and nothing is left.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import pytest

from notebook_kit.launch.native_stacks import py_spy
from tests.kernel_cells import real_kernel, run_cell

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]

DEFINE = """\
import time
import torch, torch.distributed as dist
import notebook_kit
from notebook_kit import notebook_launcher, notebook_launcher_async

def sleep_or_reduce():
    if dist.get_rank() == 0:
        time.sleep(60)  # rank 0 sleeps here
    else:
        dist.all_reduce(torch.zeros(1))  # rank 1 waits here for rank 0
"""

ASK = """\
started = time.monotonic()
try:
    answer = notebook_kit.stacks(2.0)
except RuntimeError as error:
    print("NOT YET", error)
else:
    took = time.monotonic() - started
    both = "time.sleep(60)" in answer[0] and "waiting in dist.all_reduce" in answer[1]
    print("BOTH" if both else "PARTLY", f"took={took:.2f}")
    print(answer)
"""


class _Iopub:
    """Every iopub message, kept by the request it answers (two cells run at once here)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.by_request: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)

    def until_idle(self, msg_id: str, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(_is_idle(m) for m in self.by_request[msg_id]):
                return self.by_request[msg_id]
            try:
                message = self.client.get_iopub_msg(timeout=0.2)
            except Exception:  # queue.Empty: nothing yet
                continue
            self.by_request[message["parent_header"].get("msg_id", "")].append(message)
        raise AssertionError(f"request {msg_id} did not finish within {timeout:g} s")


def _is_idle(message: dict[str, Any]) -> bool:
    return message["msg_type"] == "status" and message["content"]["execution_state"] == "idle"


def _printed(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")


def _in_subshell(client: Any, subshell: str, code: str) -> str:
    request = client.session.msg("execute_request", {"code": code, "silent": False})
    request["header"]["subshell_id"] = subshell
    client.shell_channel.send(request)
    return request["header"]["msg_id"]


LAUNCHES = {
    "blocking": "notebook_launcher(sleep_or_reduce, num_processes=2, live=False)",
    "awaited": "await notebook_launcher_async(sleep_or_reduce, num_processes=2, live=False)",
}
# How the interrupted cell ends: ipykernel cancels the task of a cell that awaits.
ENDED_BY = {"blocking": "KeyboardInterrupt", "awaited": "CancelledError"}


@pytest.mark.parametrize("form", sorted(LAUNCHES))
def test_stacks_from_a_second_cell_thread_while_a_launch_runs(form: str) -> None:
    with real_kernel() as (manager, client):
        run_cell(client, DEFINE)
        client.control_channel.send(client.session.msg("create_subshell_request", {}))
        subshell = client.control_channel.get_msg(timeout=10)["content"]["subshell_id"]
        iopub = _Iopub(client)
        launch = client.execute(LAUNCHES[form])
        asked: list[str] = []
        deadline = time.monotonic() + 60
        while not asked or "BOTH" not in asked[-1]:
            assert time.monotonic() < deadline, asked
            asked.append(_printed(iopub.until_idle(_in_subshell(client, subshell, ASK), 20)))
            time.sleep(0.2)
        manager.interrupt_kernel()  # SIGINT to the kernel's process group
        ended = iopub.until_idle(launch, 30)
    errors = [m["content"]["ename"] for m in ended if m["msg_type"] == "error"]
    assert errors == [ENDED_BY[form]], _printed(ended)
    answer = asked[-1]
    took = float(answer.split("took=")[1].split()[0])
    assert took < 3.0, answer  # within the call's 2 s, with room for a loaded machine
    assert "rank 0 (pid" in answer and "time.sleep(60)  # rank 0 sleeps here" in answer
    assert "rank 1 (pid" in answer and "dist.all_reduce(torch.zeros(1))" in answer
    if py_spy() is not None:  # its frames as plain text, the kernel's forced colours or not
        assert "time_sleep" in answer and "\x1b[" not in answer, answer
        assert "notebook_kit-stacks" not in answer and "worker/entry.py" not in answer, answer
