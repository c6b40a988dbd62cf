"""The live view's decisions without widgets: panels, units, smoothing, axes, new points, rate,
the evaluation table and the summary line."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from notebook_kit.errors import WorkerFailure
from notebook_kit.live.eval_table import build_table
from notebook_kit.live.observer import LaunchSummary, RankSummary
from notebook_kit.live.plot import draw_metrics, new_figure
from notebook_kit.live.plot_layout import (
    axis_limits,
    ema,
    eval_metrics,
    infer_x_unit,
    metric_group,
    plan_panels,
    use_log,
)
from notebook_kit.live.plot_widget import PointFeed
from notebook_kit.live.progress import RateClock, progress_line, progress_text
from notebook_kit.live.record import RunRecorder
from notebook_kit.live.summary import summary_line
from notebook_kit.runtime.messages import MetricsBatch


def test_few_metric_groups_get_a_panel_each_and_many_are_merged_by_family() -> None:
    assert metric_group("val_loss") == metric_group("train/loss") == "loss"
    few = plan_panels(["loss", "val_loss", "acc", "val_acc"])
    assert [(p.label, p.names) for p in few] == [
        ("loss", ("loss", "val_loss")),
        ("acc", ("acc", "val_acc")),
    ]
    many = plan_panels(["loss", "val_loss", "kl_loss", "acc", "top5_acc", "f1", "lr", "grad_norm"])
    assert [(p.label, p.names) for p in many] == [
        ("loss", ("loss", "val_loss", "kl_loss")),
        ("accuracy", ("acc", "top5_acc", "f1")),
        ("learning rate", ("lr",)),
        ("other", ("grad_norm",)),
    ]


def test_evaluation_metrics_are_named_so_or_logged_much_less_often() -> None:
    assert eval_metrics({"loss": 5, "val_loss": 1, "acc": 1}) == ["val_loss"]  # too early to say
    assert eval_metrics({"loss": 100, "val_loss": 4, "acc": 4, "lr": 100}) == ["val_loss", "acc"]
    assert eval_metrics({"validity": 1, "loss": 50, "test_f1": 50}) == ["validity", "test_f1"]


@pytest.mark.parametrize(
    ("last_logged", "steps", "epoch_length", "unit"),
    [
        (0, 23, 23, "epoch"),  # step=epoch after the first epoch of 23 batches
        (19, 460, 23, "epoch"),
        (22, 23, 23, "step"),  # step=global step
        (459, 460, 23, "step"),
        (5, 10, 23, "step"),  # not one epoch yet: cannot tell, steps
        (3, 0, None, "step"),  # no batches counted at all
    ],
)
def test_the_x_unit_follows_what_was_logged(
    last_logged: int, steps: int, epoch_length: int | None, unit: str
) -> None:
    assert infer_x_unit(last_logged, steps, epoch_length) == unit


def test_axis_limits_are_readable_for_one_point_and_log_scales() -> None:
    low, high = axis_limits([0.0046])
    assert low == pytest.approx(0.00414) and high == pytest.approx(0.00506)
    assert axis_limits([0.0]) == (-1.0, 1.0)
    assert axis_limits([1.0, 100.0], log=True) == pytest.approx((10**-0.1, 10**2.1))
    assert axis_limits([float("nan")]) is None
    assert use_log([150.0, 1e-7], "auto") and not use_log([150.0, -1.0], "auto")
    assert use_log([1.0, 2.0], "log") and not use_log([1e-7, 150.0], "linear")


def test_ema_is_tensorboards_debiased_average() -> None:
    assert ema([1.0, 2.0], 0.0) == [1.0, 2.0]
    smoothed = ema([1.0, 0.0, 0.0], 0.5)
    assert smoothed[0] == 1.0 and smoothed[1] == pytest.approx(1 / 3)


def test_the_feed_hands_out_only_new_points_and_corrects_a_late_rank() -> None:
    feed = PointFeed(kept_steps=4)
    feed.add_batch(MetricsBatch(0, tuple((0, s, {"loss": 1.0}) for s in range(3))))
    assert feed.take() == {"loss": ([0, 1, 2], [1.0, 1.0, 1.0])}
    assert feed.take() == {}
    feed.add_batch(MetricsBatch(1, ((1, 2, {"loss": 3.0}), (1, 3, {"loss": 5.0}))))
    assert feed.take() == {"loss": ([2, 3], [2.0, 5.0])}  # step 2 now the mean of both ranks
    feed.add_batch(MetricsBatch(0, ((0, None, {"acc": 0.5}),), None))
    assert feed.take() == {"acc": ([3], [0.5])}  # step=None numbered after rank 0's last step
    feed.add_batch(MetricsBatch(0, tuple((0, s, {"loss": 1.0}) for s in range(4, 40))))
    assert len(feed._sums["loss"]) <= 8 and feed.counts["loss"] == 40  # bounded, still counted


def test_rate_and_eta_start_from_the_first_step_not_from_the_launch() -> None:
    clock = RateClock()
    clock.observe(0, now=0.0)  # launch: forking, imports, rendezvous
    assert clock.rate is None and progress_text(0, 100, clock, now=0.0).startswith("waiting")
    clock.observe(5, now=10.0)  # first steps seen 10 s after the launch
    assert clock.rate is None
    clock.observe(25, now=12.0)
    assert clock.rate == 10.0 and clock.eta(125) == 10.0
    assert progress_text(25, 125, clock, now=12.0) == "20% · 25/125 · 00:02<00:10 · 10.0 steps/s"
    assert progress_text(25, None, clock, now=12.0) == "25 steps · 00:02 · 10.0 steps/s"


def test_table_rows_are_evaluation_rounds_with_training_averages() -> None:
    train = {"loss": [(s, float(s)) for s in range(10)]}
    table = build_table(train, {"val_loss": [(4, 0.5), (9, 0.25)]}, "epoch")
    assert table.columns == ("epoch", "loss (avg)", "val_loss")
    assert table.rows == ((4, 2.0, 0.5), (9, 7.0, 0.25))
    assert ">val_loss</th>" in table.html() and table.text().splitlines()[2].split() == [
        "9",
        "7",
        "0.25",
    ]


def test_summary_line_says_how_the_run_ended() -> None:
    ranks = (RankSummary(0, 0, 8.0), RankSummary(1, 0, 8.0))
    stopped = LaunchSummary(ranks, 8.46, stopped=True)
    assert summary_line(stopped, 460, None, {"loss": 0.0046}) == (
        "Finished in 8.5 s · 460 steps · loss 0.0046 · stopped by you"
    )
    failure = WorkerFailure(1, 1, "ValueError", "bad", "Traceback...", 0.0)
    failed = LaunchSummary(ranks, 2.0, (failure,))
    assert summary_line(failed, 0) == "Failed after 2.0 s: rank 1 (ValueError)"
    assert summary_line(LaunchSummary(ranks, 1.0, timed_out=True)).startswith("Timed out")


def test_final_figure_has_labelled_axes_legends_markers_and_sane_single_points() -> None:
    figure: Figure = new_figure(2)
    histories = {
        "loss": [(step, 1.0 / (step + 1)) for step in range(100)],
        "val_loss": [(49, 0.5), (99, 0.2)],
        "acc": [(99, 0.9)],
    }
    draw_metrics(figure, histories, x_label="epoch", evals={"val_loss"}, smoothing=0.6)
    loss_axes, acc_axes = figure.axes
    assert loss_axes.get_xlabel() == "epoch" and loss_axes.get_ylabel() == "loss"
    labels = [text.get_text() for text in loss_axes.get_legend().get_texts()]
    assert labels == ["loss", "val_loss"]
    val_line = next(line for line in loss_axes.lines if line.get_label() == "val_loss")
    assert val_line.get_marker() == "o"
    assert len(loss_axes.lines) == 3  # raw loss (faded), smoothed loss, val_loss
    assert acc_axes.get_ylim() == pytest.approx((0.81, 0.99)) and acc_axes.get_xlim() == (98, 100)


def _trainer_histories(steps: int = 40) -> dict[str, list[tuple[int, float]]]:
    """What a Trainer logs every 10 steps (an evaluation each 20): its epoch rides along."""
    logged = range(9, steps, 10)
    return {
        "loss": [(s, 1.0 / (s + 1)) for s in logged],
        "grad_norm": [(s, 2.0 + s / 100) for s in logged],
        "learning_rate": [(s, 5e-05 if s % 20 == 9 else 5.000000000000001e-05) for s in logged],
        "epoch": [(s, (s + 1) / 20) for s in logged],
        "eval_loss": [(s, 0.5) for s in logged if (s + 1) % 20 == 0],
    }


def test_a_logged_epoch_is_a_table_column_and_never_a_plotted_line() -> None:
    histories = _trainer_histories()
    names = [name for panel in plan_panels(histories) for name in panel.names]
    assert "epoch" not in names and {"loss", "grad_norm", "learning_rate", "eval_loss"} <= set(
        names
    )
    assert "epoch" not in eval_metrics({name: len(h) for name, h in histories.items()})
    figure = new_figure(4)
    draw_metrics(figure, histories, evals={"eval_loss"})
    legends = [t.get_text() for axes in figure.axes for t in axes.get_legend().get_texts()]
    assert "epoch" not in legends and "grad_norm" in legends
    train = {n: h for n, h in histories.items() if n != "eval_loss"}
    table = build_table(train, {"eval_loss": histories["eval_loss"]})
    assert table.columns[:2] == ("step", "epoch") and "epoch (avg)" not in table.columns
    assert [row[:2] for row in table.rows] == [(19, 1.0), (39, 2.0)]


def test_a_flat_learning_rate_is_a_flat_line_in_a_readable_range() -> None:
    histories = {"learning_rate": _trainer_histories()["learning_rate"]}
    assert axis_limits(v for _, v in histories["learning_rate"]) == pytest.approx((4.5e-5, 5.5e-5))
    figure = new_figure(1)
    draw_metrics(figure, histories)
    assert figure.axes[0].get_ylim() == pytest.approx((4.5e-5, 5.5e-5))


def test_thousands_of_metrics_and_huge_names_give_a_capped_legend_and_summary() -> None:
    long_name = "layer." + "x" * 10_000 + ".loss"
    latest = {long_name: 1.0, **{f"metric_{i}": float(i) for i in range(4_999)}}
    histories = {name: [(0, value), (1, value)] for name, value in latest.items()}
    panels = plan_panels(histories)
    drawn = sum(len(panel.names) for panel in panels)
    assert drawn + sum(panel.more for panel in panels) == 5_000 and drawn <= 10 * len(panels)
    figure = new_figure(len(panels))
    draw_metrics(figure, histories, panels=panels)
    for axes, panel in zip(figure.axes, panels, strict=True):
        labels = [t.get_text() for t in axes.get_legend().get_texts()]
        assert len(labels) <= 11 and max(len(label) for label in labels) <= 40
        assert labels[-1] == f"+{panel.more:,} more" if panel.more else True
    other = figure.axes[[panel.label for panel in panels].index("other")]
    assert other.get_legend().get_texts()[-1].get_text() == "+4,989 more"  # 4,999 in "other"
    done = LaunchSummary((RankSummary(0, 0, 1.0),), 1.0)
    line = summary_line(done, 2, None, latest)
    assert len(line) < 200 and line.endswith(" · +4,997 more"), line
    assert progress_line(2, None, 1.0, latest).endswith(" · +4,995 more")
    recorder = RunRecorder()  # what last_run() keeps: every name exactly as logged
    recorder.on_metrics(MetricsBatch(0, ((0, 0, latest),), None))
    assert set(recorder.finish(done).metrics) == set(latest)
