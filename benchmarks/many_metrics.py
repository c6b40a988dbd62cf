"""Cost of ending a run that logged many metrics: the final plot (layout, drawing, PNG) and the
summary line, as the kernel computes them once the workers are done.

For each number of metrics (every one a two-point history, names as long as given) it times
what the live view does at the end of a run: ``plan_panels`` + ``draw_metrics`` +
``figure_png``, and ``summary_line``. The baseline, measured in the same run, is a typical
run's three metrics; the table shows the ratio to it. ``--uncapped`` also draws every metric
in its family's panel, with a legend entry each, as the plot did before legends were capped.
Target: under a second for any number of metrics.

Usage:
    python -m benchmarks.many_metrics [--counts 3,100,1000,5000] [--repeats 3] [--uncapped]
"""

from __future__ import annotations

import argparse
import statistics
import time

from notebook_kit.live.observer import LaunchSummary, RankSummary
from notebook_kit.live.plot import draw_metrics, figure_png, new_figure
from notebook_kit.live.plot_layout import PlotPanel, plan_panels
from notebook_kit.live.summary import summary_line

History = list[tuple[int, float]]


def _histories(count: int, name_length: int) -> dict[str, History]:
    pad = "x" * max(0, name_length - 12)
    names = [f"m{i:05d}_{pad}_loss" if i % 2 else f"m{i:05d}_{pad}" for i in range(count)]
    return {name: [(0, 1.0 + i), (1, 0.5 + i)] for i, name in enumerate(names)}


def _end_of_run(histories: dict[str, History], uncapped: bool) -> tuple[float, float]:
    """Seconds to draw the final PNG, and to write the summary line."""
    started = time.perf_counter()
    panels = plan_panels(histories)
    if uncapped:  # every metric drawn, as before the legend was capped
        members: dict[str, list[str]] = {panel.label: [] for panel in panels}
        for name in histories:
            label = next((p.label for p in panels if name in p.names), panels[-1].label)
            members[label].append(name)
        panels = [PlotPanel(label, tuple(names)) for label, names in members.items() if names]
    figure = new_figure(len(panels))
    draw_metrics(figure, histories, panels=panels)
    figure_png(figure)
    drawn = time.perf_counter() - started
    started = time.perf_counter()
    latest = {name: history[-1][1] for name, history in histories.items()}
    summary_line(LaunchSummary((RankSummary(0, 0, 1.0),), 1.0), 2, None, latest)
    return drawn, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="3,100,1000,5000")
    parser.add_argument("--name-length", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--uncapped", action="store_true")
    args = parser.parse_args()
    counts = [int(part) for part in args.counts.split(",")]
    modes = [False, True] if args.uncapped else [False]
    rows: dict[tuple[int, bool], list[tuple[float, float]]] = {}
    _end_of_run(_histories(3, args.name_length), uncapped=False)  # matplotlib's first-use costs
    for _ in range(args.repeats):  # interleaved: load drift hits every row alike
        for count in [3, *counts]:
            for uncapped in modes:
                if uncapped and count > 1000:
                    continue  # minutes each: 1,000 shows the trend
                histories = _histories(count, args.name_length)
                rows.setdefault((count, uncapped), []).append(_end_of_run(histories, uncapped))
    base_draw = statistics.median(d for d, _ in rows[3, False])
    print("| metrics | legend | final plot (s) | × baseline | summary line (ms) |")
    print("|---:|---|---:|---:|---:|")
    for (count, uncapped), times in sorted(rows.items()):
        draw = statistics.median(d for d, _ in times)
        line = statistics.median(s for _, s in times) * 1000
        legend = "every metric (before)" if uncapped else "capped"
        print(f"| {count:,} | {legend} | {draw:.3f} | {draw / base_draw:.2f} | {line:.2f} |")
    print(f"baseline: 3 metrics, {base_draw:.3f} s; {args.repeats} repeats, medians")


if __name__ == "__main__":
    main()
