"""How fresh the live plot is, and what drawing costs the kernel, in a real Jupyter kernel.

Two workers train a small DDP model flat out (both cores busy), logging every step. The same
launch runs with the live view and with ``live=False`` (the baseline), alternating so that
background load hits both alike. Measured per launch:

- the kernel's CPU time (user + system of the kernel process, not its workers) per second of
  the launch: the live view's drawing cost is the difference to the baseline, in % of one core;
- the delay from a worker logging a step to that step leaving the kernel for the browser
  (the ``points`` message on IOPub; the browser draws on its next frame, see
  ``tests/browser/test_live_freshness.py`` for the page's side);
- training throughput, live over baseline.

Targets: p90 delay <= 2 s at >= 50 steps/s, drawing <= 5% of one core.

Usage:
    python -m benchmarks.live_freshness [--steps 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import psutil
from jupyter_client.manager import start_new_kernel

from benchmarks._harness import run_cell

DEFINE = """\
import json, time
import torch
from torch import nn
from notebook_kit import Accelerator, notebook_launcher

def train(steps):
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    inputs, targets = torch.randn(64, 64), torch.randn(64, 1)
    accelerator.progress(total=steps)
    logged = []
    for step in range(steps):
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        accelerator.log({"loss": loss.item()}, step=step)
        logged.append(time.time())
    accelerator.end_training()
    return logged
"""
LAUNCH = "logged = notebook_launcher(train, args=({steps},), num_processes=2{quiet})\n"
REPORT = "print('LOGGED', json.dumps(logged))"


def _delays(messages: list[dict[str, Any]], logged: list[float]) -> list[float]:
    """Per step: from the worker's log call to the first points message carrying it."""
    first_seen: dict[int, float] = {}
    for message in messages:
        content = message["content"].get("data", {}).get("content", {})
        if message["msg_type"] == "comm_msg" and "points" in content:
            for step in content["points"].get("loss", [[], []])[0]:
                first_seen.setdefault(int(step), message["arrived"])
    return sorted(first_seen.get(step, float("inf")) - at for step, at in enumerate(logged))


def _launch(client: Any, kernel: psutil.Process, steps: int, live: bool) -> dict[str, Any]:
    code = LAUNCH.format(steps=steps, quiet="" if live else ", live=False")
    before, started = kernel.cpu_times(), time.monotonic()
    messages = run_cell(client, code)
    wall = time.monotonic() - started
    after = kernel.cpu_times()
    printed = "".join(m["content"].get("text", "") for m in run_cell(client, REPORT))
    logged = json.loads(printed.split("LOGGED ", 1)[1])
    cpu = (after.user + after.system) - (before.user + before.system)
    result = {"cpu_share": cpu / wall, "rate": len(logged) / (logged[-1] - logged[0])}
    if live:
        delays = _delays(messages, logged)
        result["median"] = delays[len(delays) // 2]
        result["p90"] = delays[int(0.9 * len(delays))]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        kernel = psutil.Process(manager.provisioner.pid)
        run_cell(client, DEFINE)
        _launch(client, kernel, 200, live=True)  # first launch: imports, warm caches
        results: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for _ in range(options.rounds):
            for live in (False, True):
                results[live].append(_launch(client, kernel, options.steps, live))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    _report(results)


def _report(results: dict[bool, list[dict[str, Any]]]) -> None:
    def median(live: bool, key: str) -> float:
        return statistics.median(result[key] for result in results[live])

    live_cpu, quiet_cpu = median(True, "cpu_share"), median(False, "cpu_share")
    print(
        f"steps/s: live {median(True, 'rate'):.0f}, live=False {median(False, 'rate'):.0f} "
        f"(ratio {median(True, 'rate') / median(False, 'rate'):.2f})"
    )
    print(
        f"kernel CPU, % of one core: live {live_cpu:.1%}, live=False {quiet_cpu:.1%}; "
        f"drawing costs {live_cpu - quiet_cpu:.1%} (target <= 5%)"
    )
    print(
        f"log call -> points sent to the browser: median {median(True, 'median'):.3f} s, "
        f"p90 {median(True, 'p90'):.3f} s (target p90 <= 2 s)"
    )


if __name__ == "__main__":
    main()
