"""A figure is one panel class and one line in ``PANELS``: every display then shows it."""

from __future__ import annotations

from typing import Any

import pytest

import notebook_kit.live.notebook_view as notebook_view
from notebook_kit.live import record
from notebook_kit.live.headless import HeadlessObserver
from notebook_kit.live.notebook_view import LiveObserver
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, RankSummary
from notebook_kit.live.panels import Panel
from notebook_kit.live.record import last_run
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch, WorkerMessage

_SUMMARY = LaunchSummary((RankSummary(0, 0, 1.0), RankSummary(1, 0, 1.0)), 1.0)


class _Batches(Panel):
    """Counts the metrics batches of the attempt it was last started for."""

    name = "batches"

    def __init__(self) -> None:
        self.count = 0
        self.ended = False

    def start(self, info: LaunchInfo) -> None:
        self.count = 0

    def take(self, message: WorkerMessage) -> None:
        self.count += isinstance(message, MetricsBatch)

    def finish(self, summary: LaunchSummary) -> None:
        self.ended = True

    def live(self) -> str:
        return f"batches: {self.count}" if self.count else ""

    summary = live

    def headless(self) -> str:
        return f"[batches] {self.count}"

    def record(self) -> Any:
        return (self.count, self.ended)


@pytest.fixture(autouse=True)
def _with_a_new_panel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record, "PANELS", (*record.PANELS, _Batches))


def _batch(rank: int) -> MetricsBatch:
    return MetricsBatch(rank, ((rank, 0, {"loss": 1.0}),))


def test_a_new_panel_prints_its_line_at_the_end_and_is_kept_in_last_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    observer = HeadlessObserver()
    observer.on_start(LaunchInfo("Launching 2 processes", 2, 2, (0, 1), StopFlag()))
    observer.on_metrics(_batch(0))
    observer.on_metrics(_batch(1))
    observer.on_tick()
    observer.on_finish(_SUMMARY)
    assert "[batches] 2" in capsys.readouterr().out.splitlines()
    kept = last_run()
    assert kept is not None and kept.panels["batches"] == (2, True)


def test_a_new_panel_shows_its_line_under_the_plot_and_under_the_summary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown: list[dict[str, Any]] = []
    monkeypatch.setattr(notebook_view, "display", lambda bundle, **_: shown.append(bundle))
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(LaunchInfo("Launching 2 processes", 2, 2, (0, 1), flag))
    observer.on_tick()
    assert "batches" not in observer.lines  # nothing to say yet: no line, no model
    observer.on_metrics(_batch(0))
    observer._last_refresh = 0.0  # the view redraws at most four times a second
    observer.on_tick()
    line = observer.lines["batches"]
    assert "batches: 1" in line.value and line._dom_classes == ("nk-batches",)
    children = list(observer.box.children)  # type: ignore[union-attr]
    assert children.index(line) == children.index(observer.plot.widgets[-1]) + 1
    observer.on_metrics(_batch(1))
    observer._last_refresh = 0.0
    observer.on_tick()
    assert observer.lines["batches"] is line and "batches: 2" in line.value  # one widget
    observer.on_finish(_SUMMARY)
    assert shown[1]["text/plain"].splitlines()[1] == "batches: 2"
    assert 'class="nk-batches"' in shown[1]["text/html"]
    assert [text.get_text() for text in observer.figure.texts] == ["batches: 2"]  # in the PNG
    flag.close()
