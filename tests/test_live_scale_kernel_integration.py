"""The live view of 32 ranks on 8 nodes, in a real kernel: the largest run this machine holds.

A Dask ``LocalCluster`` of 8 worker processes (one node each) runs 4 ranks per node; every
rank logs a point and prints a line at each step. The cell's messages are read as a front end
gets them: the ranks' output is one tab of grouped lines (``ranks 0–31: step 3 done``), never
32 tabs, every step's point reaches the plot, the speed line names the median and the slowest
ranks, and ``last_run()`` keeps every rank's lines and every step.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.kernel_cells import Message, real_kernel, run_cell
from tests.optional import needs
from tests.test_cluster_integration import leftovers

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    needs("distributed", what="cluster runs"),
]

NODES, PER_NODE, STEPS = 8, 4, 12
RANKS = NODES * PER_NODE

LAUNCH = f"""
import time
import torch, torch.distributed as dist
from distributed import Client
import notebook_kit
from notebook_kit import notebook_launcher

client = Client(ADDRESS)
client.wait_for_workers({NODES})

def train():
    rank = dist.get_rank()
    for step in range({STEPS}):
        time.sleep(0.05)
        notebook_kit.log({{"loss": 1.0 / (step + 1) + rank * 1e-3}}, step=step, samples=4)
        print(f"step {{step}} done")
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"rank {{rank}} saw {{int(total.item())}}")
    return int(total.item())

result = notebook_launcher(train, cluster=client, num_nodes={NODES}, num_processes={PER_NODE})
"""

RECORD = """
record = notebook_kit.last_run()
output = record.panels["output"]
print(json.dumps({
    "result": result,
    "steps": [step for step, _ in record.metrics["loss"]],
    "rank_steps": {rank: [s for s, _ in m["loss"]] for rank, m in record.rank_metrics.items()},
    "counts": output.counts,
    "groups": [group.label() for group in output.groups()],
    "speed": record.speed is not None and sorted(record.speed.ranks),
}))
"""


@pytest.fixture(scope="module")
def cluster() -> Any:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=NODES,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",
        ) as made,
        Client(made) as client,
    ):
        client.wait_for_workers(NODES)
        yield client


def _widget_values(messages: list[Message], css_class: str) -> list[str]:
    """Each value the widget of ``css_class`` showed: made, then updated as the run went."""
    comms = {
        m["content"]["comm_id"]
        for m in messages
        if m["msg_type"] == "comm_open"
        and css_class in m["content"]["data"].get("state", {}).get("_dom_classes", ())
    }
    values = []
    for message in messages:
        if (
            message["msg_type"] in ("comm_open", "comm_msg")
            and message["content"]["comm_id"] in comms
        ):
            state = message["content"]["data"].get("state", {})
            if state.get("value"):
                values.append(state["value"])
    return values


def _plotted_steps(messages: list[Message]) -> set[int]:
    """Every step the plot was sent a point of (its custom messages carry only new points)."""
    steps: set[int] = set()
    for message in messages:
        data = message["content"].get("data", {}) if message["msg_type"] == "comm_msg" else {}
        points = data.get("content", {}).get("points", {}) if data.get("method") == "custom" else {}
        for xs, _ in points.values():
            steps.update(xs)
    return steps


def test_32_ranks_on_8_nodes_show_grouped_lines_every_point_and_every_rank_in_the_record(
    cluster: Any,
) -> None:
    with real_kernel() as (_, kernel):
        started = time.monotonic()
        address = repr(cluster.scheduler.address)
        messages = run_cell(kernel, LAUNCH.replace("ADDRESS", address), timeout=240)
        took = time.monotonic() - started
        errors = [m["content"] for m in messages if m["msg_type"] == "error"]
        assert not errors, errors
        kept = run_cell(kernel, "import json\n" + RECORD)
    printed = "".join(m["content"]["text"] for m in kept if m["msg_type"] == "stream")
    record = json.loads(printed.strip().splitlines()[-1])
    assert record["result"] == RANKS

    # The view: one tab for the 32 ranks' output, its lines grouped while the run went.
    titles = [
        m["content"]["data"]["state"]["titles"]
        for m in messages
        if m["msg_type"] in ("comm_open", "comm_msg")
        and "titles" in m["content"]["data"].get("state", {})
    ]
    assert [f"output · {RANKS} ranks"] in titles, titles
    assert not any(t and any(str(x).startswith("rank ") for x in t) for t in titles), titles
    panes = _widget_values(messages, "nk-rank-groups")
    assert panes, "the grouped pane never showed"
    last = panes[-1]
    for step in range(STEPS):
        assert f"ranks 0–{RANKS - 1}: step {step} done" in last, last
    # Every step's point reached the plot in the cell, and the speed line summed 32 ranks.
    assert _plotted_steps(messages) == set(range(STEPS))
    shown = [
        m["content"]["data"]["text/plain"]
        for m in messages
        if m["msg_type"] in ("display_data", "update_display_data")
        and "text/plain" in m["content"]["data"]
    ]
    ending = next(text for text in shown if text.startswith("Finished in"))
    assert "median step" in ending and "slowest: rank " in ending, ending
    assert f"{NODES} nodes" not in ending  # 8 nodes: a line per node, as before
    details = next(text for text in shown if text.startswith(f"--- {RANKS} ranks"))
    assert f"ranks 0–{RANKS - 1}: step {STEPS - 1} done" in details, details
    assert f"rank {RANKS - 1}: rank {RANKS - 1} saw {RANKS}" in details, details

    # The record: every rank's lines, every step of every rank.
    assert record["steps"] == list(range(STEPS))
    assert sorted(map(int, record["rank_steps"])) == list(range(RANKS))
    assert all(steps == list(range(STEPS)) for steps in record["rank_steps"].values())
    assert {int(rank): count for rank, count in record["counts"].items()} == dict.fromkeys(
        range(RANKS), STEPS + 1
    )
    groups = record["groups"]
    assert groups[:STEPS] == [f"ranks 0–{RANKS - 1}: step {s} done" for s in range(STEPS)]
    assert sorted(groups[STEPS:]) == sorted(f"rank {r}: rank {r} saw {RANKS}" for r in range(RANKS))
    assert record["speed"] == list(range(RANKS))
    print(f"8 nodes x 4 ranks in a real kernel: the launch cell took {took:.1f} s")

    deadline = time.monotonic() + 30  # a loaded machine ends 32 ranks slowly
    while leftovers(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not leftovers(cluster)
