"""Cost of the live view: training throughput with it on vs ``live=False``, and one ``log`` call.

The same 2-process DDP loop (log every step, count progress, check the Stop flag) runs with
the live view's observer (progress bar, per-rank output, new points for the browser plot) and
with the quiet one, alternating so that background load hits both alike. Outside a notebook
the widgets have no front end, but everything the kernel computes and sends (the final PNG of
the plot included) still happens. ``benchmarks.live_freshness`` measures the same in a real
kernel, with the plot's delay. Targets: throughput ratio >= 0.98; a ``log`` call <= 20 µs.

Usage:
    python benchmarks/live_overhead.py [--steps 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from notebook_kit import notebook_launcher
from notebook_kit.live.notebook_view import LiveObserver
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.metrics import close_channel, log_from_worker
from notebook_kit.runtime.progress import advance, report_total
from notebook_kit.runtime.stopping import should_stop


def _train(steps: int) -> dict[str, float]:
    """Steps per second of a small DDP loop that logs every step, and µs per log call."""
    launch = current_launch()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(64, 128), torch.randint(0, 10, (64,))
    report_total(launch, steps)
    started = time.perf_counter()
    for step in range(steps):
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log_from_worker(launch, {"loss": loss.detach(), "lr": 0.01}, step=step)
        advance(launch)
        if should_stop(launch):
            break
    steps_per_second = steps / (time.perf_counter() - started)
    calls, loss = 2000, torch.tensor(1.0)
    started = time.perf_counter()
    for step in range(calls):
        log_from_worker(launch, {"loss": loss, "lr": 0.01}, step=steps + step)
    log_us = (time.perf_counter() - started) / calls * 1e6
    close_channel(launch)
    return {"steps_per_second": steps_per_second, "log_us": log_us}


def _launch(steps: int, live: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"observer": LiveObserver()} if live else {"live": False}
    with contextlib.redirect_stdout(io.StringIO()):  # widget reprs without a front end
        return notebook_launcher(_train, args=(steps,), num_processes=2, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    rates: dict[bool, list[float]] = {True: [], False: []}
    log_costs: list[float] = []
    for _ in range(options.rounds):
        for live in (False, True):
            result = _launch(options.steps, live)
            rates[live].append(result["steps_per_second"])
            log_costs.append(result["log_us"])
    live_rate, quiet_rate = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"live=False: {quiet_rate:.1f} steps/s   live view: {live_rate:.1f} steps/s")
    print(f"throughput ratio live / quiet: {live_rate / quiet_rate:.3f} (target >= 0.98)")
    print(f"one log call: {statistics.median(log_costs):.1f} µs (target <= 20)")


if __name__ == "__main__":
    main()
