"""Cost of ``accelerator.log`` every step, in the workers of a real 2-process launch (CPU).

Each worker trains the same small MLP in interleaved blocks: without logging (the baseline),
logging the loss tensor itself (``{"loss": loss}``, read later by the sender thread), and
logging ``loss.item()`` (read on the training thread, as loops written for other tools do).
Interleaving makes background load hit every variant alike. On a GPU the tensor variant is
the one that never waits for the device; ``python -m benchmarks.gpu`` measures that there.

Usage:
    python -m benchmarks.log_overhead [--blocks 12] [--steps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch import nn

from notebook_kit import Accelerator, notebook_launcher

VARIANTS = ("without log", "log the tensor", "log loss.item()")


def _blocks(blocks: int, steps: int) -> dict[str, float]:
    """Median seconds per step of each variant, blocks interleaved in this worker."""
    torch.manual_seed(0)
    accelerator = Accelerator()
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    step = 0
    for block in range(blocks * len(VARIANTS) + len(VARIANTS)):
        variant = VARIANTS[block % len(VARIANTS)]
        started = time.perf_counter()
        for _ in range(steps):
            loss = (model(x) - y).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if variant == "log the tensor":
                accelerator.log({"loss": loss}, step=step)
            elif variant == "log loss.item()":
                accelerator.log({"loss": loss.item()}, step=step)
            step += 1
        if block >= len(VARIANTS):  # the first round warms up
            times[variant].append((time.perf_counter() - started) / steps)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--steps", type=int, default=200)
    arguments = parser.parse_args(argv)
    result = notebook_launcher(
        _blocks, args=(arguments.blocks, arguments.steps), num_processes=2, live=False
    )
    base = result["without log"]
    print("accelerator.log every step, 2 CPU workers, small MLP (median per step):")
    for name in VARIANTS:
        print(f"  {name:<16} {1e6 * result[name]:8.1f} us  (x{result[name] / base:.3f})")
    return result


if __name__ == "__main__":
    main()
