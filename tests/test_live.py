"""The live view's parts without a kernel: widgets, plot, Stop button, observer choice."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from notebook_kit.errors import WorkerFailure
from notebook_kit.live.display import default_observer, notebook_front_end
from notebook_kit.live.headless import HeadlessObserver, QuietObserver
from notebook_kit.live.notebook_view import LiveObserver
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, RankSummary
from notebook_kit.live.plot import draw_metrics, metric_group
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
    assert output.widget.titles[1] == "rank 1 ✗" and output.widget.selected_index == 1


def test_last_segment_keeps_what_a_terminal_shows() -> None:
    assert last_segment("plain") == "plain"
    assert last_segment("a\rb\r") == "b"


def test_metrics_of_one_kind_share_an_axes_and_sparse_ones_get_markers() -> None:
    assert metric_group("val_loss") == metric_group("train/loss") == "loss"
    figure = Figure()
    histories = {
        "loss": [(step, 1.0 / (step + 1)) for step in range(100)],
        "val_loss": [(50, 0.5), (99, 0.2)],
        "acc": [(step, step / 100) for step in range(100)],
    }
    draw_metrics(figure, histories)
    loss_axes, acc_axes = figure.axes
    assert [line.get_label() for line in loss_axes.lines] == ["loss", "val_loss"]
    assert loss_axes.lines[1].get_marker() == "o" and loss_axes.lines[0].get_marker() == "None"
    assert [line.get_label() for line in acc_axes.lines] == ["acc"]


def test_stop_button_only_sets_the_flag_and_not_after_the_run() -> None:
    flag = StopFlag()
    button = StopButton(flag)
    assert not button.serve_during_run()  # no kernel here: the hint tells what to do
    assert "notebook_launcher_async" in button.note.value
    button.button.click()
    assert flag.is_set()
    flag.clear()
    button.finish()
    button.button.click()
    assert not flag.is_set() and button.button.disabled
    flag.close()


def _info(flag: StopFlag) -> LaunchInfo:
    return LaunchInfo("Launching 2 processes", 2, 2, (0, 1), flag)


def _batch(steps: int, total: int | None = None) -> dict:
    records = [(0, step, {"loss": 1.0 / (step + 1)}) for step in range(steps)]
    return {"records": records, "dropped": 0, "steps": steps, "total": total}


def test_live_observer_shows_progress_plot_and_records_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(_info(flag))
    observer.on_output(0, "stdout", "hello")
    observer.on_message(0, BATCH_KIND, _batch(30, total=100))
    observer.on_message(1, BATCH_KIND, {**_batch(30), "dropped": 7})
    observer.on_tick()
    assert observer.progress is not None and observer.progress.bar.n == 30
    assert observer.progress.bar.total == 100
    assert "7 metric records" in observer.status.value
    flag.set()
    summary = LaunchSummary((RankSummary(0, 0, 2.0), RankSummary(1, 0, 2.0)), 2.1, stopped=True)
    observer.on_finish(summary)
    assert "Stopped by request" in observer.status.value
    record = last_run()
    assert record is not None and record.stopped and record.dropped == 7
    assert record.metrics["loss"][:2] == [(0, 1.0), (1, 0.5)]
    assert isinstance(record.figure, Figure) and record.figure.axes
    assert observer.stop is not None and observer.stop.button.disabled
    flag.close()


def test_live_observer_reports_a_failed_rank() -> None:
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(_info(flag))
    failure = WorkerFailure(1, 1, "ValueError", "bad", "Traceback...", 0.0)
    summary = LaunchSummary((RankSummary(0, -15, 1.0), RankSummary(1, 1, 1.0)), 1.0, (failure,))
    observer.on_finish(summary)
    assert "Failed after 1.0 s: rank 1" in observer.status.value
    record = last_run()
    assert record is not None and not record.succeeded and record.figure is None
    flag.close()
