"""The live view's Stacks and Profile buttons in a real kernel, clicked mid-run.

A thread of the kernel clicks a button of the view while a 2-rank launch runs (rank 0
sleeping, rank 1 waiting for it in ``dist.all_reduce``), as a click served on the view's
subshell route does: the handler runs off the main thread. Once the block under the plot shows
both ranks, the thread clicks Stop; the run ends at a step, and the saved output keeps what the
block showed as plain text, as ``last_run()`` does.
"""

from __future__ import annotations

import json

import pytest

from tests.kernel_cells import real_kernel, run_cell

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]

CELL = """\
import gc, threading, time
import torch, torch.distributed as dist
import notebook_kit
from notebook_kit import notebook_launcher
from notebook_kit.live.stacks_panel import StacksPanel
from notebook_kit.live.stop_button import StopPanel

def train():
    for step in range(600):
        if dist.get_rank() == 0:
            time.sleep(0.05)  # rank 0 sleeps here
        dist.all_reduce(torch.zeros(1))  # rank 1 waits here for rank 0
        notebook_kit.log({"loss": 1.0 / (step + 1)}, step=step)
        if notebook_kit.should_stop():
            return step

def built(kind, widget):
    found = [p for p in gc.get_objects() if isinstance(p, kind) and getattr(p, widget)]
    return found[-1] if found else None

seen = {}

def click():
    deadline = time.monotonic() + 60
    while built(StacksPanel, "button") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    stacks = built(StacksPanel, "button")
    time.sleep(1.0)  # the ranks are in their loop
    stacks.button.click()
    while "rank 1" not in stacks.block.value and time.monotonic() < deadline:
        time.sleep(0.05)
    seen["block"] = stacks.block.value
    built(StopPanel, "button").button.click()

threading.Thread(target=click, daemon=True).start()
notebook_launcher(train, num_processes=2, live=True)
"""


def test_clicking_stacks_mid_run_shows_every_rank_under_the_plot_and_keeps_them() -> None:
    with real_kernel() as (_, client):
        messages = run_cell(client, CELL, timeout=120)
        errors = [m["content"] for m in messages if m["msg_type"] == "error"]
        assert not errors, errors
        shown = [
            m["content"]["data"]["text/plain"]
            for m in messages
            if m["msg_type"] in ("display_data", "update_display_data")
            and "text/plain" in m["content"]["data"]
        ]
        saved = [text for text in shown if text.startswith("Stacks at ")]
        assert len(saved) == 1, shown  # one plain-text output under the summary
        kept = run_cell(
            client,
            "record = notebook_kit.last_run(); print(sorted(record.panels['stacks']), "
            "record.stopped); print(seen['block'])",
        )
    printed = "".join(m["content"]["text"] for m in kept if m["msg_type"] == "stream")
    assert printed.splitlines()[0] == "[0, 1] True", printed
    for text in (saved[0], printed):  # the saved output, and the block under the plot
        assert "rank 0 (pid" in text and "time.sleep(0.05)  # rank 0 sleeps here" in text, text
        assert "rank 1 (pid" in text, text
    assert 'class="nk-stacks"' not in printed and "height:260px" in printed  # a fixed block


PROFILE_CELL = (
    CELL.replace("StacksPanel", "ProfilePanel")
    .replace(
        "from notebook_kit.live.stacks_panel import", "from notebook_kit.live.profile_panel import"
    )
    .replace(
        '{"loss": 1.0 / (step + 1)}, step=step', '{"loss": 1.0 / (step + 1)}, step=step, samples=4'
    )
)


def test_clicking_profile_mid_run_shows_each_ranks_operators_and_timeline_and_keeps_them() -> None:
    """A hand-written loop whose steps are its log(samples=...) calls: five are profiled."""
    with real_kernel() as (_, client):
        messages = run_cell(client, PROFILE_CELL, timeout=120)
        errors = [m["content"] for m in messages if m["msg_type"] == "error"]
        assert not errors, errors
        saved = [
            m["content"]["data"]
            for m in messages
            if m["msg_type"] == "display_data"
            and m["content"]["data"].get("text/plain", "").startswith("Profile\n")
        ]
        assert len(saved) == 1, [m["content"] for m in messages if m["msg_type"] == "display_data"]
        shown = json.dumps([m["content"] for m in messages])  # the ranks' output included
        assert "USDT:" not in shown and "registerClient" not in shown  # the profiler's notes
        kept = run_cell(
            client,
            "profile = notebook_kit.last_run().profile\n"
            "print(sorted(profile), [r.trace.exists() for r in profile.values()])\n"
            "print(seen['block'])",
        )
    printed = "".join(m["content"]["text"] for m in kept if m["msg_type"] == "stream")
    assert printed.splitlines()[0] == "[0, 1] [True, True]", printed
    for rank in (0, 1):
        assert f"rank {rank} · 5 steps · trace " in saved[0]["text/plain"]
        assert f"rank {rank} · 5 steps · trace " in printed  # the block under the plot
    assert "all_reduce" in saved[0]["text/plain"] or "allreduce" in saved[0]["text/plain"]
    assert saved[0]["text/html"].startswith('<img src="data:image/png;base64,')
    assert 'src="data:image/png;base64,' in printed and "http" not in saved[0]["text/html"]
