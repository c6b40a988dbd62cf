"""The Stop button in a real kernel: a click during the launching cell ends the run cleanly.

The test plays JupyterLab 4's part: it finds the button's comm on iopub, creates a subshell on
the control channel and sends the click as a ``comm_msg`` carrying that ``subshell_id``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.kernel_cells import cell_messages, real_kernel, run_cell

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]

DEFINE = """\
import time
import notebook_kit
from notebook_kit import notebook_launcher, notebook_launcher_async
from notebook_kit.runtime.metrics import close_channel, log_from_worker
from notebook_kit.runtime.progress import advance
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.stopping import should_stop

def train(seconds=60.0):
    launch, step, started = current_launch(), 0, time.monotonic()
    while time.monotonic() - started < seconds:
        time.sleep(0.01)
        log_from_worker(launch, {"loss": 1.0 / (step + 1)}, step=step)
        advance(launch)
        step += 1
        if should_stop(launch):
            break
    close_channel(launch)
    return {"steps": step, "seconds": time.monotonic() - started}
"""

REPORT = (
    "\nprint('RESULT', result['seconds'] < 30, notebook_kit.last_run().stopped, "
    "len(notebook_kit.last_run().metrics['loss']) == result['steps'])"
)


@pytest.fixture(scope="module")
def kernel() -> Iterator[tuple[Any, Any]]:
    with real_kernel() as (manager, client):
        run_cell(client, DEFINE)
        yield manager, client


class _Clicker:
    """Clicks the Stop button once the run has gone on for a while, as JupyterLab would."""

    def __init__(self, client: Any, after: float = 1.5) -> None:
        self.client = client
        self.after = after
        self.button: str | None = None
        self.shown_at = 0.0
        self.clicked_at: float | None = None

    def __call__(self, message: dict) -> None:
        content = message["content"]
        if message["msg_type"] == "comm_open":
            state = content["data"].get("state", {})
            if state.get("_model_name") == "ButtonModel" and state.get("description") == "Stop":
                self.button, self.shown_at = content["comm_id"], time.monotonic()
        # The progress bar updates several times a second while the workers run.
        ready = self.button is not None and time.monotonic() - self.shown_at > self.after
        if ready and self.clicked_at is None:
            self.click()

    def click(self) -> None:
        request = self.client.session.msg("create_subshell_request", {})
        self.client.control_channel.send(request)
        reply = self.client.control_channel.get_msg(timeout=10)
        click = self.client.session.msg(
            "comm_msg",
            {"comm_id": self.button, "data": {"method": "custom", "content": {"event": "click"}}},
        )
        click["header"]["subshell_id"] = reply["content"]["subshell_id"]
        self.client.shell_channel.send(click)
        self.clicked_at = time.monotonic()


def _printed(messages: list[dict]) -> str:
    return "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")


def _errors(messages: list[dict]) -> list[str]:
    return [m["content"]["ename"] for m in messages if m["msg_type"] == "error"]


def test_click_during_a_blocking_launch_stops_every_rank(kernel: tuple[Any, Any]) -> None:
    _, client = kernel
    clicker = _Clicker(client)
    code = "result = notebook_launcher(train, num_processes=2)" + REPORT
    messages = cell_messages(client, client.execute(code), timeout=90, on_message=clicker)
    assert clicker.clicked_at is not None, "the run never showed progress"
    assert _errors(messages) == []
    assert "RESULT True True True" in _printed(messages)
    idle = messages[-1]
    assert idle["content"]["execution_state"] == "idle"


def test_click_during_an_awaited_launch_without_subshells(kernel: tuple[Any, Any]) -> None:
    """Where the click cannot be routed to a subshell, the awaited launch still serves it."""
    _, client = kernel
    clicker = _Clicker(client)
    code = (
        "import notebook_kit.live.kernel_status as stop_button\n"
        "stop_button._self_client = lambda: None  # as on a kernel without subshells\n"
        # An earlier launch's route is kept: close it (dropped unclosed, its client's zmq
        # context would block the kernel when the garbage collector ends it).
        "if stop_button._KEPT is not None:\n"
        "    stop_button._KEPT.forget()\n"
        "result = await notebook_launcher_async(train, num_processes=2)" + REPORT
    )
    messages = cell_messages(client, client.execute(code), timeout=90, on_message=clicker)
    assert clicker.clicked_at is not None
    assert _errors(messages) == []
    assert "RESULT True True True" in _printed(messages)
    hints = [
        m["content"]["data"]["state"].get("value", "")
        for m in messages
        if m["msg_type"] == "comm_msg" and "state" in m["content"]["data"]
    ]
    assert any(re.search(r"await notebook_launcher_async", str(hint)) for hint in hints)
