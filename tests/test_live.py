"""The live view's parts without a kernel: widgets, plot, Stop button, observer choice."""

from __future__ import annotations

from typing import Any

import pytest
from matplotlib.figure import Figure

import notebook_kit.live.notebook_view as notebook_view
from notebook_kit.errors import WorkerFailure
from notebook_kit.live.display import default_observer, notebook_front_end
from notebook_kit.live.headless import HeadlessObserver, QuietObserver
from notebook_kit.live.notebook_view import LiveObserver
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, RankSummary
from notebook_kit.live.rank_output import RankOutput, last_segment
from notebook_kit.live.record import last_run
from notebook_kit.live.stop_button import StopButton
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.metrics import BATCH_KIND


def test_without_a_notebook_front_end_the_text_displays_are_chosen() -> None:
    assert not notebook_front_end()
    assert isinstance(default_observer(None), HeadlessObserver)
    assert isinstance(default_observer(True), HeadlessObserver)
    assert isinstance(default_observer(False), QuietObserver)


def test_rank_output_groups_lines_and_marks_errors() -> None:
    output = RankOutput((0, 1))
    output.add(0, "stdout", "epoch 0 <done>")
    output.add(1, "stderr", "  5%|#|\r 50%|#####|\r100%|##########|")
    output.refresh()
    panes = output.widget.children
    assert "epoch 0 &lt;done&gt;" in panes[0].value
    assert "100%" in panes[1].value and "50%" not in panes[1].value
    assert "color:#b00020" in panes[1].value
    assert output.widget.titles == ("rank 0", "rank 1 (stderr)")
    output.finish((RankSummary(0, 0, 1.0), RankSummary(1, 1, 1.0)))
    assert output.widget.titles[1] == "rank 1 ✗"
    static = output.static_html()
    assert "<details open><summary style" in static and "rank 1 ✗ · 1 line" in static
    assert static.count("<details open>") == 2  # short outputs are shown open
    assert output.text().splitlines() == [
        "--- rank 0 · 1 line ---",
        "epoch 0 <done>",
        "--- rank 1 ✗ · 1 line ---",
        "100%|##########|",
    ]


def test_rank_output_keeps_its_height_from_the_start() -> None:
    output = RankOutput((0,))
    empty = output.widget.children[0].value
    output.add(0, "stdout", "x")
    output.refresh()
    full = output.widget.children[0].value
    assert "nothing printed yet" in empty and "height:9.5em" in empty and "height:9.5em" in full


def test_last_segment_keeps_what_a_terminal_shows() -> None:
    assert last_segment("plain") == "plain"
    assert last_segment("a\rb\r") == "b"


def test_stop_button_only_sets_the_flag_and_not_after_the_run() -> None:
    flag = StopFlag()
    button = StopButton(flag)
    assert not button.serve_during_run()  # no kernel here: the hint tells what to do
    assert "notebook_launcher_async" in button.note.value and button.note.layout.display is None
    button.button.click()
    assert flag.is_set()
    button.show_stopping()
    assert button.button.description == "Stopping…" and button.button.disabled
    flag.clear()
    assert button.finish() is None  # no route to close
    button.button.click()
    assert not flag.is_set()
    flag.close()


def _info(flag: StopFlag) -> LaunchInfo:
    return LaunchInfo("Launching 2 processes", 2, 2, (0, 1), flag)


def _batch(steps: int, total: int | None = None) -> dict[str, Any]:
    records = [(0, step, {"loss": 1.0 / (step + 1)}) for step in range(steps)]
    return {"records": records, "dropped": 0, "steps": steps, "total": total}


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the live view displays, as mime bundles (outside a kernel nothing renders)."""
    bundles: list[dict[str, Any]] = []

    def display(bundle: dict[str, Any], raw: bool = False, display_id: bool = False) -> None:
        bundles.append(bundle)

    monkeypatch.setattr(notebook_view, "display", display)
    return bundles


def _points_sent(observer: LiveObserver, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    sent: list[Any] = []
    monkeypatch.setattr(observer.plot.plot, "send", sent.append)
    return sent


def test_live_observer_sends_only_new_points_and_shows_progress_without_an_empty_bar(
    shown: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = StopFlag()
    observer = LiveObserver()
    sent = _points_sent(observer, monkeypatch)
    observer.on_start(_info(flag))
    assert "widget-view+json" in next(iter(shown[0])) and "live view" in shown[0]["text/plain"]
    progress = observer.progress
    assert progress is not None and progress.bar.layout.display == "none"  # no total: no bar
    observer.on_message(0, BATCH_KIND, _batch(30))
    observer.on_message(1, BATCH_KIND, {**_batch(30), "dropped": 7})
    observer.on_tick()
    assert progress.bar.layout.display == "none" and progress.text.value.startswith("30 steps")
    assert sent[-1]["points"]["loss"][0] == list(range(30))
    assert "7 metric records" in observer.status.value
    observer._last_refresh = 0.0
    batch = {"records": [(0, 30, {"loss": 0.1})], "dropped": 0, "steps": 31, "total": 100}
    observer.on_message(0, BATCH_KIND, batch)
    observer.on_tick()
    assert sent[-1] == {"points": {"loss": [[30], [0.1]]}}  # only the new step travels
    assert (progress.bar.max, progress.bar.value) == (100, 31)
    assert progress.bar.layout.display is None  # a total: the bar shows
    assert observer.plot.plot.spec["panels"] == [{"label": "loss", "names": ["loss"]}]
    flag.close()


def test_after_the_run_a_summary_png_and_rank_text_replace_the_widgets(
    shown: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(_info(flag))
    observer.on_output(1, "stdout", "epoch 3: val_loss 0.5")
    observer.on_message(0, BATCH_KIND, _batch(30, total=30))
    observer.on_message(0, "log", {"rank": 0, "step": 29, "values": {"val_loss": 0.5}})
    observer.on_tick()
    flag.set()
    summary = LaunchSummary((RankSummary(0, 0, 2.0), RankSummary(1, 0, 2.0)), 2.1, stopped=True)
    observer.on_finish(summary)
    ending, figure, details = shown[1:]
    assert ending["text/plain"] == (
        "Finished in 2.1 s · 30 steps · loss 0.03333 · val_loss 0.5 · stopped by you\n"
        "Launching 2 processes"
    )
    assert "nk-summary" in ending["text/html"]
    assert figure["image/png"].startswith(b"\x89PNG") and "loss, val_loss" in figure["text/plain"]
    assert "evaluation rounds" in details["text/plain"]
    assert "--- rank 1 · 1 line ---\nepoch 3: val_loss 0.5" in details["text/plain"]
    record = last_run()
    assert record is not None and record.stopped
    assert record.metrics["loss"][:2] == [(0, 1.0), (1, 0.5)]
    assert isinstance(record.figure, Figure) and record.figure.axes
    assert observer.box is not None and observer.box.comm is None  # widgets closed
    flag.close()


def test_live_observer_reports_a_failed_rank(shown: list[dict[str, Any]]) -> None:
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(_info(flag))
    failure = WorkerFailure(1, 1, "ValueError", "bad", "Traceback...", 0.0)
    summary = LaunchSummary((RankSummary(0, -15, 1.0), RankSummary(1, 1, 1.0)), 1.0, (failure,))
    observer.on_finish(summary)
    assert shown[1]["text/plain"].startswith("Failed after 1.0 s: rank 1 (ValueError)\n")
    assert "#b00020" in shown[1]["text/html"] and len(shown) == 2  # no plot, no output
    record = last_run()
    assert record is not None and not record.succeeded and record.figure is None
    flag.close()


def test_a_restarted_launch_gets_a_fresh_live_view(shown: list[dict[str, Any]]) -> None:
    flag = StopFlag()
    observer = LiveObserver()
    for attempt in range(2):  # max_restarts: on_start and on_finish once per attempt
        observer.on_start(_info(flag))
        assert observer.box is not None and observer.box.comm is not None
        observer.on_message(0, BATCH_KIND, _batch(10 * (attempt + 1), total=20))
        observer.on_tick()
        summary = LaunchSummary((RankSummary(0, 0, 1.0), RankSummary(1, 0, 1.0)), 1.0)
        observer.on_finish(summary)
    endings = [b["text/plain"] for b in shown if b.get("text/plain", "").startswith("Finished")]
    assert len(endings) == 2 and endings[-1].startswith("Finished in 1.0 s · 20 steps")
    flag.close()
