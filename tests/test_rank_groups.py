"""The view stays readable with many ranks: grouped output, a rank filter, a summarised speed
line, and a saved notebook that stays small (no kernel: the real view with its display
captured)."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets
import nbformat
import pytest

import notebook_kit.live.notebook_view as notebook_view
from notebook_kit.errors import WorkerFailure
from notebook_kit.live.grouped_output import heading
from notebook_kit.live.headless import HeadlessObserver
from notebook_kit.live.notebook_view import LiveObserver
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, RankSummary
from notebook_kit.live.rank_groups import RankLines, parse_ranks, rank_spec, ranks_label
from notebook_kit.live.record import last_run
from notebook_kit.live.speed import SpeedTracker, speed_line
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch, RankSpeed

SAVED_BOUND = 1_000_000  # bytes of a saved notebook's cell: 512 ranks x 100 lines


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the live view displays, as mime bundles (outside a kernel nothing renders)."""
    bundles: list[dict[str, Any]] = []

    def display(bundle: dict[str, Any], raw: bool = False, display_id: bool = False) -> None:
        bundles.append(bundle)

    monkeypatch.setattr(notebook_view, "display", display)
    return bundles


def _info(ranks: int, per_node: int = 0) -> LaunchInfo:
    nodes = tuple(rank // per_node for rank in range(ranks)) if per_node else ()
    return LaunchInfo(f"Launching {ranks}", ranks, ranks, tuple(range(ranks)), StopFlag(), nodes)


def _ended(ranks: int, failures: tuple[WorkerFailure, ...] = ()) -> LaunchSummary:
    codes = {failure.rank: 1 for failure in failures}
    return LaunchSummary(
        tuple(RankSummary(r, codes.get(r, -15 if failures else 0), 1.0) for r in range(ranks)),
        1.0,
        failures,
    )


def test_ranks_are_written_as_ranges_and_lists_and_long_lists_are_counted() -> None:
    assert rank_spec([12, 0, 1, 2, 3, 8, 10, 11]) == "0–3, 8, 10–12"
    assert ranks_label(range(512)) == "ranks 0–511" and ranks_label([7, 7]) == "rank 7"
    assert rank_spec(range(0, 100, 2), pieces=2) == "0, 2 … +48 more"


def test_the_rank_filter_reads_ranges_and_names_what_is_wrong() -> None:
    assert parse_ranks("0-3, 8,10–11", range(16)) == (0, 1, 2, 3, 8, 10, 11)
    assert parse_ranks("  ", range(16)) is None
    for text, said in (
        ("0-3,x", "'x' is not a rank or a range"),
        ("7-2", "'7-2' runs backwards"),
        ("14-20", "no rank 16–20 in this run"),
        ("1..3", "'1..3' is not a rank or a range"),
    ):
        with pytest.raises(ValueError, match="rank filter") as raised:
            parse_ranks(text, range(16))
        assert said in str(raised.value), raised.value
        assert "such as 0-7,12 (this run has ranks 0–15)" in str(raised.value)


def test_lines_alike_share_one_line_in_the_order_they_first_came() -> None:
    lines = RankLines(range(16))
    lines.take(3, "stdout", "warming up")
    for rank in range(16):
        lines.take(rank, "stdout", "epoch 1")
    for rank in (0, 1, 2, 3, 8, 10, 11, 12):
        lines.take(rank, "stderr", "slow disk")
    lines.take(3, "stdout", "epoch 1")
    assert [group.label() for group in lines.groups()] == [
        "rank 3: warming up",
        "ranks 0–15: epoch 1 (17 times)",
        "ranks 0–3, 8, 10–12: slow disk",
    ]
    assert [group.stderr for group in lines.groups()] == [False, False, True]
    assert lines.own(3) == [
        ("stdout", "warming up"),
        ("stdout", "epoch 1"),
        ("stderr", "slow disk"),
        ("stdout", "epoch 1"),
    ]


def test_distinct_lines_past_the_bound_are_counted_and_let_go_the_oldest_first() -> None:
    lines = RankLines(range(16))
    for number in range(2100):
        lines.take(number % 16, "stdout", f"line {number}")
    groups = lines.groups()
    assert len(groups) == 2000 and lines.dropped_groups == 100
    assert groups[0].text == "line 100" and groups[-1].text == "line 2099"
    assert heading(lines) == "16 ranks · 2100 lines, 2100 distinct"
    assert len(lines.own(0)) == 132  # each rank keeps its own newest lines (all of them here)


def _speed(ranks: int, slow: int, per_node: int = 1) -> MetricsBatch:
    """A batch per rank, rank ``slow`` twice as slow at reading data as the others."""
    batches = []
    for rank in range(ranks):
        data = 0.11 if rank == slow else 0.01 + rank * 1e-4
        speed = RankSpeed(
            samples=20,
            batches=20,
            seconds=2.0,
            timed_steps=20,
            step_seconds=20 * (0.1 + data),
            data_seconds=20 * data,
            wait_seconds=0.0,
        )
        batches.append(MetricsBatch(rank, (), 0, None, speed))
    return batches


def test_many_ranks_show_as_one_tab_of_groups_failed_and_straggler_first(
    shown: list[dict[str, Any]],
) -> None:
    observer = LiveObserver()
    observer.on_start(_info(16, per_node=4))
    output = observer.output
    assert output.tabs.titles == ("output · 16 ranks",) and len(output.tabs.children) == 1
    for batch in _speed(16, slow=9):
        observer.on_metrics(batch)
    for rank in range(16):
        observer.on_output(rank, "stdout", "epoch 3")
    observer.on_output(5, "stderr", "about to fail")
    observer.on_output(9, "stdout", "reading shard 9")
    observer.on_tick()
    pane = output.grouped.pane.value
    assert pane.index("rank 9 · node 2 · the straggler:") < pane.index("ranks 0–15: epoch 3")
    assert "reading shard 9" in pane and "rank 5: about to fail" in pane
    failure = WorkerFailure(5, 1, "ValueError", "bad batch", "Traceback\n  raise\nValueError", 0.0)
    observer.on_finish(_ended(16, (failure,)))
    saved = shown[-1]["text/plain"]
    assert saved.splitlines()[:7] == [
        "--- 16 ranks · 18 lines, 3 distinct ---",
        "rank 5 · node 1 ✗ failed:",
        "  epoch 3",
        "  about to fail",
        "  Traceback",
        "    raise",
        "  ValueError",
    ]
    assert saved.index("the straggler") < saved.index("ranks 0–15: epoch 3")
    assert "color:#b00020" in shown[-1]["text/html"]
    kept = last_run().panels["output"]
    assert isinstance(kept, RankLines) and kept.failed == (5,) and kept.straggler == 9


def test_the_rank_filter_shows_the_ranks_own_lines_and_says_what_is_wrong(
    shown: list[dict[str, Any]],
) -> None:
    observer = LiveObserver()
    observer.on_start(_info(12))
    grouped = observer.output.grouped
    assert grouped.filter in observer.output.controls  # served while the cell runs
    for step in range(3):
        for rank in range(12):
            observer.on_output(rank, "stdout", f"step {step}")
    observer.on_output(4, "stdout", "only four")
    grouped.filter.value = "3-4"
    observer.on_tick()
    rows = grouped.pane.value.split("<pre", 1)[1]
    assert "[rank 3] step 0" in rows and "[rank 4] only four" in rows and "rank 5" not in rows
    assert rows.index("[rank 3] step 2") < rows.index("[rank 4] step 2")  # arrival order
    assert "showing 3–4" in grouped.note.value
    grouped.filter.value = "3-99"
    observer._last_refresh = 0.0
    observer.on_tick()
    assert "no rank 12–99 in this run" in grouped.note.value and "#b00020" in grouped.note.value
    assert "ranks 0–11: step 0" in grouped.pane.value  # a bad filter shows every rank
    grouped.filter.value = ""
    observer.on_finish(_ended(12))


def test_without_a_notebook_lines_many_ranks_print_alike_are_printed_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    observer = HeadlessObserver(interval=3600)
    observer.on_start(_info(32))
    for rank in range(32):
        observer.on_output(rank, "stdout", "epoch 3")
    observer.on_output(7, "stderr", "warning: slow")
    observer.on_tick()  # held: the other ranks' copies may come within the second
    assert "epoch 3" not in capsys.readouterr().out
    observer.on_finish(_ended(32))
    printed = capsys.readouterr()
    assert printed.out.splitlines() == ["[ranks 0–31] epoch 3"]
    assert printed.err == "[rank 7] warning: slow\n"
    groups = last_run().panels["output"].groups()
    assert [group.label() for group in groups] == ["ranks 0–31: epoch 3", "rank 7: warning: slow"]


def _view_widgets(widget: Any, seen: dict[str, Any]) -> dict[str, Any]:
    """Every model under ``widget`` (children, layouts, styles), as a saved notebook keeps them."""
    for part in (widget, getattr(widget, "layout", None), getattr(widget, "style", None)):
        if isinstance(part, widgets.Widget) and part.comm is not None:
            seen[part.model_id] = part
    for child in getattr(widget, "children", ()):
        _view_widgets(child, seen)
    return seen


def _saved_size(outputs: list[dict[str, Any]], state: dict[str, Any]) -> int:
    """Bytes of a notebook holding one cell with ``outputs`` and the widget ``state``."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(
        nbformat.v4.new_code_cell(
            "notebook_launcher(train, cluster=cluster, num_nodes=64, num_processes=8)",
            outputs=[nbformat.v4.new_output("display_data", data=bundle) for bundle in outputs],
        )
    )
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": state}
    nbformat.validate(notebook)
    return len(nbformat.writes(notebook).encode())


@pytest.mark.parametrize("alike", [True, False], ids=["lines-alike", "every-line-its-own"])
def test_512_ranks_printing_100_lines_each_save_under_a_megabyte(
    shown: list[dict[str, Any]], alike: bool
) -> None:
    observer = LiveObserver()
    observer.on_start(_info(512, per_node=8))
    failure = WorkerFailure(300, 1, "RuntimeError", "boom", "Traceback\n" + "  frame\n" * 40, 0.0)
    for step in range(100):
        for rank in range(512):
            text = f"epoch {step // 10} step {step}" if alike else f"rank {rank} loss {step}.{rank}"
            # lines as long as a log line or a progress bar: 2,000 of them would pass 1 MB
            observer.on_output(rank, "stdout", f"{text} " + "·" * 120)
        observer.on_tick()
        observer._last_refresh = 0.0
    mid_run = _view_widgets(observer.box, {})
    state = widgets.Widget.get_manager_state(widgets=mid_run.values())
    assert _saved_size(shown, state) <= SAVED_BOUND  # saved mid-run, its widgets live
    observer.on_finish(_ended(512, (failure,)))
    ending = _saved_size(shown, {"version_major": 2, "version_minor": 0, "state": {}})
    assert ending <= SAVED_BOUND
    saved = shown[-1]["text/plain"]
    assert saved.startswith("--- 512 ranks · 51200 lines") and "rank 300 · node 37 ✗" in saved
    if alike:
        assert "ranks 0–511: epoch 9 step 99 " in saved and "(1024 times)" not in saved
    else:
        assert "earlier distinct lines" in saved and "rank 511: rank 511 loss 99.511" in saved
    kept = last_run().panels["output"]
    assert kept.own(511)[-1][1].startswith("epoch 9 step 99" if alike else "rank 511 loss 99")


def test_the_speed_line_of_many_ranks_names_the_median_the_slowest_three_and_the_straggler() -> (
    None
):
    tracker = SpeedTracker()
    for batch in _speed(32, slow=20):
        tracker.take(batch.rank, batch.speed)
    nodes = {rank: rank // 2 for rank in range(32)}  # 16 nodes of 2
    lines = speed_line(tracker.speed(), nodes).splitlines()
    assert len(lines) == 2, lines  # the run's line and one line for all the nodes
    assert "median step 111.6 ms · slowest: rank 20 210.0 ms, rank 31 113.1 ms" in lines[0]
    assert ", rank 30 " in lines[0] and "straggler: rank 20 on node 10 (data" in lines[0]
    assert lines[1].startswith("16 nodes: median step 111.5 ms · slowest: node 10 (ranks 20–21)")
    assert "161.1 ms, node 15 (ranks 30–31) 113.1 ms, node 14 (ranks 28–29)" in lines[1]
    few = SpeedTracker()
    for batch in _speed(4, slow=2):
        few.take(batch.rank, batch.speed)
    line = speed_line(few.speed(), {0: 0, 1: 0, 2: 1, 3: 1})
    assert "median step" not in line and "node 1 (ranks 2-3): step" in line  # as before
