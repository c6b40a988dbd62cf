"""The live view in a real kernel, seen as a front end sees it: the kernel stays Busy for the
whole launch (also across the Stop button's subshell traffic and a click), new points reach
the plot while the workers train, and the end of the run is plain output.

The kernel's state is followed the way jupyter_server and JupyterLab follow it: every
``status`` message counts, whichever request it answers (except the untracked types).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.kernel_cells import real_kernel, run_cell

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]

DEFINE = """\
import time
from notebook_kit import notebook_launcher
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.metrics import close_channel, log_from_worker
from notebook_kit.runtime.progress import advance, report_total
from notebook_kit.runtime.stopping import should_stop

def train(steps=400, pause=0.01):
    launch = current_launch()
    report_total(launch, steps)
    step = 0
    for step in range(steps):
        time.sleep(pause)
        log_from_worker(launch, {"loss": 1.0 / (step + 1), "sent": time.time()}, step=step)
        advance(launch)
        if should_stop(launch):
            break
    close_channel(launch)
    return step
"""
# Parent types whose status jupyter_server does not track (its untracked_message_types).
_UNTRACKED = {"comm_info_request", "kernel_info_request", "shutdown_request", "interrupt_request"}
_IDLE_GAP_LIMIT = 0.5  # seconds an Idle may show before the keeper's Busy corrects it


@pytest.fixture(scope="module")
def kernel() -> Iterator[Any]:
    with real_kernel() as (_, client):
        run_cell(client, DEFINE)
        yield client


def _run_all(client: Any, msg_id: str, timeout: float, on_message: Any = None) -> list[dict]:
    """Every iopub message (any parent) until the request ``msg_id`` is idle."""
    messages, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = client.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
        message["received"] = time.monotonic()
        messages.append(message)
        if on_message is not None:
            on_message(message)
        mine = message["parent_header"].get("msg_id") == msg_id
        if (
            mine
            and message["msg_type"] == "status"
            and message["content"]["execution_state"] == "idle"
        ):
            return messages
    raise AssertionError("the cell did not finish")


class _Clicker:
    """Clicks Stop through a subshell once ``after`` seconds of progress were shown."""

    def __init__(self, client: Any, after: float) -> None:
        self.client, self.after = client, after
        self.button: str | None = None
        self.shown_at = 0.0
        self.clicked = False

    def __call__(self, message: dict) -> None:
        if message["msg_type"] == "comm_open":
            state = message["content"]["data"].get("state", {})
            if state.get("_model_name") == "ButtonModel" and state.get("description") == "Stop":
                self.button, self.shown_at = message["content"]["comm_id"], time.monotonic()
        if self.button and not self.clicked and time.monotonic() - self.shown_at > self.after:
            self.clicked = True
            request = self.client.session.msg("create_subshell_request", {})
            self.client.control_channel.send(request)
            reply = self.client.control_channel.get_msg(timeout=10)
            data = {"method": "custom", "content": {"event": "click"}}
            click = self.client.session.msg("comm_msg", {"comm_id": self.button, "data": data})
            click["header"]["subshell_id"] = reply["content"]["subshell_id"]
            self.client.shell_channel.send(click)


def _idle_spells(messages: list[dict], cell: str) -> tuple[list[float], int]:
    """Durations the kernel looked idle while the cell ran, and how many foreign idles came."""
    state, since, spells, foreign = "busy", 0.0, [], 0
    statuses = [m for m in messages if m["msg_type"] == "status"]
    started = next(m for m in statuses if m["parent_header"].get("msg_id") == cell)["received"]
    for message in statuses:
        parent = message["parent_header"]
        if message["received"] < started or parent.get("msg_type") in _UNTRACKED:
            continue
        new = message["content"]["execution_state"]
        if parent.get("msg_id") == cell and new == "idle":
            break  # the cell's own end
        foreign += new == "idle" and parent.get("msg_id") != cell
        if new == "idle" and state != "idle":
            since = message["received"]
        elif new != "idle" and state == "idle":
            spells.append(message["received"] - since)
        state = new
    if state == "idle":
        spells.append(float("inf"))
    return spells, foreign


def test_kernel_shows_busy_for_the_whole_launch_also_across_a_click(kernel: Any) -> None:
    clicker = _Clicker(kernel, after=1.0)
    cell = kernel.execute("result = notebook_launcher(train, args=(2000,), num_processes=2)")
    messages = _run_all(kernel, cell, timeout=120, on_message=clicker)
    assert clicker.clicked, "the run never showed its Stop button"
    spells, foreign = _idle_spells(messages, cell)
    assert foreign >= 3, "the route's comm, the clicker's subshell and the click publish idle"
    assert all(spell < _IDLE_GAP_LIMIT for spell in spells), f"idle while running: {spells}"
    printed = [m for m in messages if m["msg_type"] == "error"]
    assert printed == []


def _plot_pushes(messages: list[dict]) -> list[tuple[float, dict]]:
    pushes = []
    for message in messages:
        data = message["content"].get("data", {})
        if message["msg_type"] == "comm_msg" and data.get("method") == "custom":
            content = data.get("content", {})
            if "points" in content:
                pushes.append((message["received"], content["points"]))
    return pushes


def test_new_points_reach_the_front_end_while_training_and_only_once(kernel: Any) -> None:
    cell = kernel.execute("result = notebook_launcher(train, args=(300,), num_processes=2)")
    messages = _run_all(kernel, cell, timeout=120)
    pushes = _plot_pushes(messages)
    ended = messages[-1]["received"]
    assert len([t for t, _ in pushes if t < ended - 1.0]) >= 4, "points arrive as they are logged"
    sent_steps = [step for _, points in pushes for step in points["loss"][0]]
    assert sorted(set(sent_steps)) == list(range(300))
    assert len(sent_steps) <= 1.2 * 300, "steps are re-sent only when a late rank changes them"
    # Freshness in the kernel: a point leaves it soon after a worker logged it.
    delays = sorted(
        received - sent
        for received, points in pushes
        for sent in points.get("sent", [[], []])[1]
        if sent is not None
    )
    wall = time.time() - time.monotonic()  # points carry wall-clock times
    delays = sorted(d + wall for d in delays)
    assert delays and delays[int(0.9 * len(delays))] < 1.5, delays[-5:]
    shown = [m for m in messages if m["msg_type"] in ("display_data", "update_display_data")]
    kinds = [(m["msg_type"], sorted(m["content"]["data"])) for m in shown]
    assert kinds == [
        ("display_data", ["application/vnd.jupyter.widget-view+json", "text/plain"]),
        ("update_display_data", ["text/html", "text/plain"]),  # the summary, in its place
        ("display_data", ["image/png", "text/plain"]),
    ]
    assert shown[1]["content"]["data"]["text/plain"].startswith("Finished in")


def test_the_launchs_own_requests_never_show_idle_while_the_cell_runs(kernel: Any) -> None:
    """The route's requests end with ``idle`` too; it is published only once the run's outputs
    are in place, right before the cell's own: a front end polling between two messages
    (``GET /api/kernels``) never reads Idle mid-run. The route's subshell is made once per
    kernel: a later launch only opens its one comm on it."""
    run_cell(kernel, "notebook_launcher(train, args=(30,), num_processes=2)")  # routes once
    cell = kernel.execute("result = notebook_launcher(train, args=(100,), num_processes=2)")
    messages = _run_all(kernel, cell, timeout=120)
    statuses = [m for m in messages if m["msg_type"] == "status"]
    foreign = [
        m["parent_header"]["msg_type"] for m in statuses if m["parent_header"].get("msg_id") != cell
    ]
    assert "comm_open" in foreign, foreign  # the route claims the Stop button and controls
    assert not {"create_subshell_request", "delete_subshell_request"} & set(foreign), foreign
    last_output = max(
        i
        for i, m in enumerate(messages)
        if m["msg_type"] in ("display_data", "update_display_data")
    )
    idle_at = [
        i
        for i, m in enumerate(messages)
        if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
    ]
    assert idle_at and min(idle_at) > last_output, "an idle came while the cell was drawing"
    assert messages[-2]["content"].get("execution_state") == "busy"  # answers the held idles


def test_an_idle_the_front_end_caused_before_the_live_view_is_undone_as_it_shows(
    kernel: Any,
) -> None:
    """JupyterLab creates a subshell for its comms when the first widget shows, on the control
    channel: that request's ``idle`` may come after the next cell began a launch. The kernel
    reads Busy again from the moment the live view is displayed."""
    state: dict[str, Any] = {}

    def front_end(message: dict) -> None:
        mine = message["parent_header"].get("msg_id") == state.get("cell")
        if mine and message["msg_type"] == "status" and "sent" not in state:
            state["sent"] = True
            request = kernel.session.msg("create_subshell_request", {})
            kernel.control_channel.send(request)
            kernel.control_channel.get_msg(timeout=10)

    # The Stop button's route opens late (at the first progress, a second in): the busy keeper
    # must not wait for it.
    state["cell"] = cell = kernel.execute(
        "import notebook_kit.live.notebook_view as view\n"
        "def train_later():\n"
        "    print('started', flush=True)\n"
        "    time.sleep(1.0)\n"
        "    return train(50)\n"
        "time.sleep(1.0)\n"
        "route_after, view.ROUTE_AFTER = view.ROUTE_AFTER, 60.0\n"
        "try:\n"
        "    result = notebook_launcher(train_later, num_processes=2)\n"
        "finally:\n"
        "    view.ROUTE_AFTER = route_after\n"
    )
    messages = _run_all(kernel, cell, timeout=120, on_message=front_end)
    tracked = [
        (i, m)
        for i, m in enumerate(messages)
        if m["msg_type"] == "status" and m["parent_header"].get("msg_type") not in _UNTRACKED
    ]
    foreign_idle = next(
        i
        for i, m in tracked
        if m["parent_header"].get("msg_type") == "create_subshell_request"
        and m["content"]["execution_state"] == "idle"
    )
    shown = next(i for i, m in enumerate(messages) if m["msg_type"] == "display_data")
    assert foreign_idle < shown, "the front end's request ended before the launch showed"
    after = next((i, m) for i, m in tracked if i > foreign_idle)
    assert after[1]["content"]["execution_state"] == "busy"
    assert after[1]["parent_header"]["msg_id"] == cell, after[1]["parent_header"]
    assert after[0] == shown + 1, "Busy again right as the live view shows"
    printed = next(  # the line shown in rank 0's tab
        i for i, m in enumerate(messages) if m["msg_type"] == "comm_msg" and "started" in str(m)
    )
    assert after[0] < printed, "Busy before the workers' first output"
