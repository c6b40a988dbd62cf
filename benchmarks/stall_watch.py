"""Cost of the stall watch: a launch that logs and prints every step, watched and not.

The kernel notes the time of every line and message a rank sends, and each worker keeps one
thread waiting in ``sigwait`` for a stack request; nothing else runs while the ranks make
progress. This runs the same 2-process loop (an all-reduce, a ``log`` and a ``print`` per step)
with ``stall_seconds=60`` (the default) and with ``stall_seconds=None`` (no watch), alternating
rounds so that background load hits both alike, and prints the throughput ratio. Target: 1.00
within the spread of the rounds (>= 0.98).

Usage:
    python -m benchmarks.stall_watch [--steps 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from notebook_kit import log, notebook_launcher


def _loop(steps: int) -> float:
    """Steps per second of a loop that sends a metric and a line at every step."""
    value = torch.ones(16)
    started = time.perf_counter()
    for step in range(steps):
        dist.all_reduce(value)
        log({"value": float(value[0])}, step=step)
        print(f"step {step}", flush=True)
    return steps / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    rates: dict[str, list[float]] = {"watched": [], "not watched": []}
    settings = {"watched": 60.0, "not watched": None}
    for round_index in range(options.rounds):
        order = list(settings) if round_index % 2 == 0 else list(settings)[::-1]
        for name in order:
            rates[name].append(
                notebook_launcher(
                    _loop, args=(options.steps,), num_processes=2, live=False,
                    stall_seconds=settings[name],
                )
            )  # fmt: skip
    watched, baseline = (statistics.median(rates[n]) for n in ("watched", "not watched"))
    for name, values in rates.items():
        print(
            f"{name:>12}: median {statistics.median(values):,.0f} steps/s "
            f"(range {min(values):,.0f}-{max(values):,.0f}, {len(values)} rounds)"
        )
    print(f"ratio watched / not watched: {watched / baseline:.3f} (target >= 0.98)")


if __name__ == "__main__":
    main()
