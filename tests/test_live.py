"""The live view's parts without a kernel: widgets, plot, Stop button, observer choice."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from matplotlib.figure import Figure

import notebook_kit.live.notebook_view as notebook_view
from notebook_kit.errors import WorkerFailure
from notebook_kit.live.display import default_observer, notebook_front_end
from notebook_kit.live.headless import HeadlessObserver, QuietObserver, last_segment
from notebook_kit.live.kernel_status import open_route
from notebook_kit.live.notebook_view import LiveObserver
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, RankSummary
from notebook_kit.live.rank_output import RankOutputPanel
from notebook_kit.live.record import last_run
from notebook_kit.live.shared_models import SharedModels
from notebook_kit.live.stop_button import StopPanel
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch, OutputLine, Progress


def test_without_a_notebook_front_end_the_text_displays_are_chosen() -> None:
    assert not notebook_front_end()
    assert isinstance(default_observer(None), HeadlessObserver)
    assert isinstance(default_observer(True), HeadlessObserver)
    assert isinstance(default_observer(False), QuietObserver)


def test_without_a_notebook_progress_lines_come_every_interval_with_the_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    observer = HeadlessObserver(interval=0.0)  # a line at every tick
    observer.on_start(_info(StopFlag()))
    for step in (1, 2, 3):
        observer.on_metrics(_batch(step, 10))
        observer.on_tick()
    observer.on_finish(LaunchSummary((RankSummary(0, 0, 1.0), RankSummary(1, 0, 1.0)), 1.0))
    lines = capsys.readouterr().out.splitlines()
    progress = [line for line in lines if line.startswith("[progress] ")]
    assert [line.split(" · ")[0] for line in progress] == [
        "[progress] step 1/10 (10%)",
        "[progress] step 2/10 (20%)",
        "[progress] step 3/10 (30%)",
    ]
    assert "steps/s" not in progress[0] and "steps/s" in progress[-1]  # from the first step on
    assert "loss" in progress[-1] and lines[-1].startswith("[finished] step 3/10 (30%)")


def _rank_tabs(*ranks: int) -> RankOutputPanel:
    """The ranks' output panel as the notebook view builds it and a launch starts it."""
    panel = RankOutputPanel()
    panel.build(SimpleNamespace(shared=SharedModels()))
    panel.start(LaunchInfo("run", len(ranks), len(ranks), ranks, StopFlag()))
    return panel


def test_rank_output_groups_lines_and_marks_errors() -> None:
    output = _rank_tabs(0, 1)
    output.take(OutputLine(0, "stdout", "epoch 0 <done>"))
    output.take(OutputLine(1, "stderr", "  5%|#|\r 50%|#####|\r100%|##########|"))
    output.draw()
    panes = output.tabs.children
    assert "epoch 0 &lt;done&gt;" in panes[0].value
    assert "100%" in panes[1].value and "50%" not in panes[1].value
    assert "color:#b00020" in panes[1].value
    assert output.tabs.titles == ("rank 0", "rank 1 (stderr)")
    output.finish(LaunchSummary((RankSummary(0, 0, 1.0), RankSummary(1, 1, 1.0)), 1.0))
    assert output.tabs.titles[1] == "rank 1 ✗"
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
    output = _rank_tabs(0)
    empty = output.tabs.children[0].value
    output.take(OutputLine(0, "stdout", "x"))
    output.draw()
    full = output.tabs.children[0].value
    assert "nothing printed yet" in empty and "height:9.5em" in empty and "height:9.5em" in full


def test_last_segment_keeps_what_a_terminal_shows() -> None:
    assert last_segment("plain") == "plain"
    assert last_segment("a\rb\r") == "b"


def test_stop_button_only_sets_the_flag_and_not_after_the_run() -> None:
    flag = StopFlag()
    panel = StopPanel()
    panel.build(SimpleNamespace(shared=SharedModels(), routed=False))
    panel.start(_info(flag))
    assert open_route((panel.button,)) is None  # no kernel here: the hint tells what to do
    panel.draw()  # the clicks are not routed: the hint
    assert "notebook_launcher_async" in panel.note.value and panel.note.layout.display is None
    panel.button.click()
    assert flag.is_set()
    panel.draw()  # the flag is seen: "Stopping…"
    assert panel.button.description == "Stopping…" and panel.button.disabled
    flag.clear()
    assert panel.finish(LaunchSummary((), 1.0)) is None  # no route to close
    panel.button.click()
    assert not flag.is_set()
    flag.close()


def _info(flag: StopFlag) -> LaunchInfo:
    return LaunchInfo("Launching 2 processes", 2, 2, (0, 1), flag)


def _batch(steps: int, total: int | None = None) -> MetricsBatch:
    records = tuple((0, step, {"loss": 1.0 / (step + 1)}) for step in range(steps))
    return MetricsBatch(0, records, 0, Progress(steps, total))


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
    assert progress is not None and progress.fraction is None  # no total: no bar
    assert "progress-bar" not in progress.widget.value
    observer.on_metrics(_batch(30))
    observer.on_metrics(dataclasses.replace(_batch(30), rank=1, dropped=7))
    observer.on_tick()
    assert "progress-bar" not in progress.widget.value and progress.text.startswith("30 steps")
    assert ">30 steps" in progress.widget.value  # the text, in the one widget
    assert sent[-1]["points"]["loss"][0] == list(range(30))
    assert "7 metric records" in observer.lines["status"].value
    observer._last_refresh = 0.0
    observer.on_metrics(MetricsBatch(0, ((0, 30, {"loss": 0.1}),), 0, Progress(31, 100)))
    observer.on_tick()
    assert sent[-1] == {"points": {"loss": [[30], [0.1]]}}  # only the new step travels
    assert progress.fraction == 0.31 and 'class="progress-bar"' in progress.widget.value
    assert "width:31%" in progress.widget.value  # a total: the bar shows
    assert observer.plot.plot.spec["panels"] == [{"label": "loss", "names": ["loss"]}]
    flag.close()


def test_after_the_run_a_summary_png_and_rank_text_replace_the_widgets(
    shown: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(_info(flag))
    observer.on_output(1, "stdout", "epoch 3: val_loss 0.5")
    observer.on_metrics(_batch(30, total=30))
    observer.on_metrics(MetricsBatch(0, ((0, 29, {"val_loss": 0.5}),), None))
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


class Cell:
    """A cell's outputs as a front end keeps them: a display with an id is updated in place."""

    def __init__(self) -> None:
        self.outputs: list[dict[str, Any]] = []

    def display(self, bundle: dict[str, Any], raw: bool = False, display_id: bool = False) -> Any:
        self.outputs.append(bundle)
        return _Handle(self.outputs, len(self.outputs) - 1) if display_id else None

    def shown(self) -> list[dict[str, Any]]:
        return [bundle for bundle in self.outputs if any(bundle.values())]


class _Handle:
    def __init__(self, outputs: list[dict[str, Any]], index: int) -> None:
        self.outputs, self.index = outputs, index

    def update(self, bundle: dict[str, Any], raw: bool = False) -> None:
        self.outputs[self.index] = bundle


def test_a_restarted_launch_shows_one_view_in_place_of_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each attempt's widgets take the place of the last attempt's summary, whose plot and
    output go: the cell ends with one summary, counting every step once, and one plot."""
    cell = Cell()
    monkeypatch.setattr(notebook_view, "display", cell.display)
    flag = StopFlag()
    observer = LiveObserver()
    lost = WorkerFailure(1, None, None, "node 1 lost: its Dask worker left the cluster", "", 1.0)
    peer = WorkerFailure(0, None, "DistBackendError", "Connection closed by peer", "", 0.5)
    for attempt, steps in enumerate((range(0, 12), range(10, 20))):  # resumed at step 10
        observer.on_start(_info(flag))
        assert observer.box is not None and observer.box.comm is not None
        assert [next(iter(b)) for b in cell.shown()] == [notebook_view._WIDGET_VIEW]
        counted = len(steps)  # rank 0's count starts again at every attempt
        records = tuple((0, step, {"loss": 1.0 / (step + 1)}) for step in steps)
        observer.on_metrics(MetricsBatch(0, records, 0, Progress(counted)))
        observer.on_output(0, "stdout", f"attempt {attempt}")
        observer.on_tick()
        failures = (peer, lost) if attempt == 0 else ()  # rank 0 failed for want of rank 1
        observer.on_finish(LaunchSummary((), 1.0, failures))
        if attempt == 0:
            assert cell.shown()[0]["text/plain"].startswith(
                "Failed after 1.0 s: rank 1 (node 1 lost), then rank 0 · 12 steps"
            )
    summary, figure, details = cell.shown()
    assert summary["text/plain"].startswith("Finished in ")
    assert " · 20 steps · loss 0.05 · after 1 restart\n" in summary["text/plain"]
    assert figure["image/png"].startswith(b"\x89PNG") and "attempt 1" in details["text/plain"]
    record = last_run()
    assert record.steps == 20 and record.attempts[0].failure.startswith("rank 1: node 1 lost")
    flag.close()


def test_steps_logged_from_one_or_now_and_then_count_as_the_steps_taken(
    shown: list[dict[str, Any]],
) -> None:
    """Without a counter, the last logged step says how many were taken: 60 for steps 1..60
    (the Trainer's numbering), 60 for every tenth step logged from step 9 to 59."""
    for steps in (range(1, 61), range(9, 60, 10)):
        flag = StopFlag()
        observer = LiveObserver()
        observer.on_start(_info(flag))
        records = tuple((0, step, {"loss": 1.0 / step}) for step in steps)
        observer.on_metrics(MetricsBatch(0, records, 0, Progress(0)))
        observer.on_finish(LaunchSummary((), 1.0))
        ending = [b["text/plain"] for b in shown if b["text/plain"].startswith("Finished")]
        assert " · 60 steps · " in ending[-1], (steps, ending[-1])
        assert last_run().steps == 60
        flag.close()


def _trainer_batch(steps: int) -> MetricsBatch:
    """Records as the Trainer logs them: an ``epoch`` and a flat learning rate with each."""
    records = [
        (0, step, {"loss": 1.0 / (step + 1), "learning_rate": 5e-5, "epoch": (step + 1) / 10})
        for step in range(steps)
    ]
    return MetricsBatch(0, tuple(records), 0, Progress(steps))


def _finish(observer: LiveObserver) -> Any:
    observer.on_finish(LaunchSummary((RankSummary(0, 0, 1.0), RankSummary(1, 0, 1.0)), 1.0))
    record = last_run()
    assert record is not None and isinstance(record.figure, Figure)
    return record.figure


def test_a_logged_epoch_offers_an_x_axis_switch_and_the_plot_follows_it(
    shown: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(_info(flag))
    controls = observer.plot.controls_widget
    assert observer.plot.controls == [controls] and controls in observer.box.children
    assert controls.plot == observer.plot.plot.model_id  # the switch shows from the plot's spec
    assert controls.x_axis == "step" and "x_metric" not in observer.plot.plot.spec  # no epoch
    # Published from the main thread, the controls' events would wait for the busy main shell.
    published: list[Any] = []
    monkeypatch.setattr(controls, "_send", lambda message, buffers=None: published.append(message))
    observer.on_metrics(_trainer_batch(30))
    observer.on_tick()
    spec = observer.plot.plot.spec
    assert spec["x_metric"] == "epoch" and published == []
    assert [panel["names"] for panel in spec["panels"]] == [["loss"], ["learning_rate"]]
    controls.set_state({"x_axis": "epoch", "smoothing": 0.5})  # the user's pick, as it arrives
    figure = _finish(observer)
    axes = figure.axes[0]
    assert axes.get_xlabel() == "epoch" and len(figure.axes) == 2
    drawn = [line for line in axes.lines if line.get_label() == "loss"]
    assert list(drawn[0].get_xdata()) == pytest.approx([(step + 1) / 10 for step in range(30)])
    assert shown[2]["text/plain"].endswith("by epoch>")
    low, high = figure.axes[1].get_ylim()  # the flat learning rate: a flat line, ±10%
    assert (low, high) == pytest.approx((4.5e-5, 5.5e-5))
    flag.close()


def test_the_x_axis_is_chosen_in_code_and_is_the_step_by_default(
    shown: list[dict[str, Any]],
) -> None:
    with pytest.raises(ValueError, match="x_axis must be 'step' or 'epoch', got 'time'"):
        LiveObserver(x_axis="time")  # type: ignore[arg-type]
    for x_axis, logged, label in (
        ("step", _trainer_batch(20), "step"),
        ("epoch", _trainer_batch(20), "epoch"),
        ("epoch", _batch(20), "step"),  # no epoch logged: the step it is
    ):
        flag = StopFlag()
        observer = LiveObserver(x_axis=x_axis)
        observer.on_start(_info(flag))
        assert observer.plot.controls_widget.x_axis == x_axis  # the view starts with it
        observer.on_metrics(logged)
        observer.on_tick()
        assert _finish(observer).axes[0].get_xlabel() == label, (x_axis, label)
        flag.close()


def test_the_live_view_opens_few_widget_models_and_closes_them_all(
    shown: list[dict[str, Any]],
) -> None:
    """Every widget model is a comm opened and closed in each launch: the view's widgets share
    their default layout and style and make the evaluation table only with an evaluation."""
    import ipywidgets
    from ipywidgets.widgets.widget import _instances as models  # every open model, by id

    before = set(models)
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(_info(flag))
    opened = [w for key, w in models.items() if key not in before]
    # 46 when each widget had its own layout and style; 8 of these are the Stacks and Profile
    # buttons (with their styles) and their blocks (with their own layouts, hidden until asked)
    assert len(opened) <= 28, len(opened)
    layouts = {w.layout.model_id for w in opened if isinstance(w, ipywidgets.DOMWidget)}
    assert len(layouts) <= 9, len(layouts)  # the shared one, and those of fixed size
    observer.on_metrics(_batch(30, total=30))
    observer.on_metrics(MetricsBatch(0, ((0, 29, {"val_loss": 0.5}),), None))
    observer.on_tick()
    assert observer.lines.get("evaluations") is not None and len(set(models) - before) <= 29
    _finish(observer)
    assert set(models) <= before, "every model of the view is closed"
    flag.close()


def _attempt(observer: LiveObserver, world: int, steps: range, attempt: float) -> None:
    from notebook_kit.runtime.messages import MetricsBatch

    observer.on_start(LaunchInfo("run", world, world, tuple(range(world)), StopFlag()))
    for rank in range(world):
        records = tuple((rank, step, {"loss": float(step), "attempt": attempt}) for step in steps)
        observer.on_metrics(MetricsBatch(rank, records))
    observer.on_tick()
    failed = attempt == 0
    failures = (WorkerFailure(1, 1, "RuntimeError", "boom", "", 0.0),) if failed else ()
    observer.on_finish(LaunchSummary(ranks=(), duration=1.0, failures=failures))


def test_a_restart_goes_on_in_one_plot_its_replayed_steps_replacing_the_old():
    observer = LiveObserver()
    _attempt(observer, 4, range(0, 8), 0.0)  # failed after step 7; the checkpoint was at 4
    _attempt(observer, 2, range(5, 10), 1.0)  # resumed on 2 ranks from step 5
    record = last_run()
    assert record.metrics["attempt"] == [(s, float(s >= 5)) for s in range(10)]
    assert [(a.world_size, a.first_step, a.outcome) for a in record.attempts] == [
        (4, 0, "failed"),
        (2, 5, "success"),
    ]
    assert record.attempts[0].failure == "rank 1: RuntimeError: boom"
    assert observer.plot.marks == [[5, "restart 1 · 2 ranks"]]
    assert observer.plot.plot.spec["marks"] == [[5, "restart 1 · 2 ranks"]]
    steps, values = observer.plot.plot.snapshot["attempt"]  # what a browser opened now draws
    assert (steps, values) == (list(range(10)), [float(s >= 5) for s in range(10)])
    axes = record.figure.axes[0]
    assert [text.get_text() for text in axes.texts] == ["restart 1 · 2 ranks"]
