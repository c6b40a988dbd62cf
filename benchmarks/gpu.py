"""GPU figures in one command: step time, logging overhead, launch latency, fp16 loss scaling.

Run from the repository root on a machine with a CUDA GPU (about 3 minutes)::

    python -m benchmarks.gpu [--out benchmarks/results]

Writes ``gpu.md`` (and ``gpu.json``) with, all measured in this one run:

* step time in one process (the kernel's case), bf16 autocast, fused AdamW, two MLP sizes:
  a plain hand-written autocast loop (the baseline), notebook_kit's Accelerator and, where
  installed, Hugging Face Accelerate's — interleaved blocks, median per step;
* ``accelerator.log({"loss": loss})`` every step inside a launch vs the same loop without it;
* trivial-launch latency (2 workers, one all_reduce) vs torch's own fork launcher;
* time to the first optimizer step of a forked worker on the GPU (``isolate=True``), with the
  worker's CUDA initialisation measured on its own;
* an fp16 run with GradScaler: steps skipped for overflow and the final loss.

The CUDA measurements run in child processes, so this process stays free of CUDA and can
fork launches the way a notebook kernel does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = {"4x256 MLP, batch 64": (256, 64), "4x4096 MLP, batch 512": (4096, 512)}
BLOCKS, STEPS_PER_BLOCK = 12, 100


# -- measured in a child process (CUDA) --------------------------------------------------------


def _model_and_data(width: int, batch: int) -> tuple[Any, Any, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())]
    model = nn.Sequential(*layers[:-1]).cuda()
    x = torch.randn(batch, width, device="cuda")
    return model, x, torch.randn(batch, width, device="cuda")


def _loops(width: int, batch: int) -> dict[str, Any]:
    """One step function per variant, each with its own model and optimizer."""
    import torch

    loops = {}
    model, x, y = _model_and_data(width, batch)
    plain_optimizer = torch.optim.AdamW(model.parameters(), fused=True)

    def plain() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = (model(x).float() - y).pow(2).mean()
        loss.backward()
        plain_optimizer.step()
        plain_optimizer.zero_grad()

    loops["plain autocast loop"] = plain
    loops["notebook_kit"] = _accelerated("notebook_kit", width, batch)
    with contextlib.suppress(ImportError):  # Accelerate is optional (the bench extra)
        loops["accelerate"] = _accelerated("accelerate", width, batch)
    return loops


def _accelerated(module: str, width: int, batch: int) -> Any:
    import importlib

    import torch

    accelerator = importlib.import_module(module).Accelerator(mixed_precision="bf16")
    model, x, y = _model_and_data(width, batch)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)

    def step() -> None:
        loss = (model(x) - y).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    return step


def _time_block(step: Any, steps: int) -> float:
    import torch

    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def _interleaved(loops: dict[str, Any]) -> dict[str, float]:
    """Median step time of each loop over interleaved blocks (after one warm-up block each)."""
    times: dict[str, list[float]] = {name: [] for name in loops}
    for step in loops.values():
        _time_block(step, 20)
    for block in range(BLOCKS):
        for name, step in (
            list(loops.items())[block % len(loops) :] + list(loops.items())[: block % len(loops)]
        ):
            times[name].append(_time_block(step, STEPS_PER_BLOCK))
    return {name: statistics.median(values) for name, values in times.items()}


def measure_steps() -> dict[str, Any]:
    return {label: _interleaved(_loops(*size)) for label, size in SIZES.items()}


def _logging_loop(log_every_step: bool) -> float:
    import torch

    from notebook_kit import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    model, x, y = _model_and_data(256, 64)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    times = []
    for block in range(BLOCKS):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for step in range(STEPS_PER_BLOCK):
            loss = (model(x) - y).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if log_every_step:
                accelerator.log({"loss": loss}, step=block * STEPS_PER_BLOCK + step)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) / STEPS_PER_BLOCK)
    return statistics.median(times[1:])


def measure_logging() -> dict[str, float]:
    from notebook_kit import notebook_launcher

    # Inside a launch (one process, in this process) so that every log call really sends.
    results: dict[str, list[float]] = {"without log": [], "log every step": []}
    for _ in range(3):
        results["without log"].append(notebook_launcher(_logging_loop, args=(False,), live=False))
        results["log every step"].append(notebook_launcher(_logging_loop, args=(True,), live=False))
    return {name: statistics.median(values) for name, values in results.items()}


def measure_fp16() -> dict[str, Any]:
    import torch

    from notebook_kit import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    model, x, y = _model_and_data(256, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    skipped, loss = 0, None
    for step in range(200):
        loss = (model(x) - y).pow(2).mean() * (float("inf") if step == 100 else 1.0)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        skipped += int(accelerator.optimizer_step_was_skipped)
    final = (model(x) - y).pow(2).mean().item()
    return {"steps": 200, "skipped": skipped, "final loss": final}


def _child(section: str) -> None:
    measure = {"steps": measure_steps, "logging": measure_logging, "fp16": measure_fp16}
    print(json.dumps(measure[section]()))


# -- measured in this (CUDA-free) process -----------------------------------------------------


def _in_child(section: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--child", section],
        capture_output=True, text=True, timeout=240, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_launch(repeats: int = 15) -> dict[str, float]:
    from benchmarks._tools import TOOLS
    from benchmarks._workloads import Task

    times: dict[str, list[float]] = {"notebook_kit": [], "torch-fork": []}
    with tempfile.TemporaryDirectory() as run_dir:
        for tool in times:
            TOOLS[tool].load()
            TOOLS[tool].launch(Task("allreduce", run_dir))  # warm-up
        for _ in range(repeats):
            for tool in times:
                started = time.perf_counter()
                TOOLS[tool].launch(Task("allreduce", run_dir))
                times[tool].append(time.perf_counter() - started)
    return {tool: statistics.median(values) for tool, values in times.items()}


def _first_gpu_step() -> dict[str, float]:
    import torch

    from notebook_kit import Accelerator

    started = time.perf_counter()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    cuda_init = time.perf_counter() - started
    accelerator = Accelerator(mixed_precision="bf16")
    model, x, y = _model_and_data(256, 64)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward((model(x) - y).pow(2).mean())
    optimizer.step()
    torch.cuda.synchronize()
    return {"cuda init": cuda_init}


def measure_first_step(repeats: int = 3) -> dict[str, float]:
    from notebook_kit import notebook_launcher

    rows: dict[str, list[float]] = {"launch to first step": [], "cuda init": []}
    for _ in range(repeats + 1):
        started = time.perf_counter()
        inner = notebook_launcher(_first_gpu_step, isolate=True, live=False)
        rows["launch to first step"].append(time.perf_counter() - started)
        rows["cuda init"].append(inner["cuda init"])
    return {
        "first": rows["launch to first step"][0],
        "repeat": statistics.median(rows["launch to first step"][1:]),
        "cuda init (repeat)": statistics.median(rows["cuda init"][1:]),
    }


def _report(results: dict[str, Any]) -> str:
    lines = ["# GPU benchmarks", "", "## Step time, one process, bf16 (median per step)", ""]
    for label, times in results["steps"].items():
        base = times["plain autocast loop"]
        cells = [f"{name} {1000 * t:.3f} ms (x{t / base:.3f})" for name, t in times.items()]
        lines.append(f"- {label}: " + ", ".join(cells))
    logging = results["logging"]
    ratio = logging["log every step"] / logging["without log"]
    lines += ["", f"## accelerator.log every step: x{ratio:.3f} the loop without logging", ""]
    launch = results["launch"]
    lines += [
        f"## Trivial launch (2 workers, one all_reduce): notebook_kit "
        f"{1000 * launch['notebook_kit']:.1f} ms vs torch fork {1000 * launch['torch-fork']:.1f}"
        f" ms (x{launch['notebook_kit'] / launch['torch-fork']:.2f})",
        "",
    ]
    first = results["first step"]
    lines += [
        f"## Forked worker on the GPU, launch to first optimizer step: first "
        f"{first['first']:.2f} s, repeat {first['repeat']:.2f} s, of which CUDA "
        f"initialisation {first['cuda init (repeat)']:.2f} s",
        "",
    ]
    fp16 = results["fp16"]
    lines.append(
        f"## fp16 with GradScaler: {fp16['skipped']} of {fp16['steps']} steps skipped for "
        f"overflow, final loss {fp16['final loss']:.4f}"
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    cli.add_argument("--child", help=argparse.SUPPRESS)
    arguments = cli.parse_args()
    if arguments.child:
        _child(arguments.child)
        return
    results = {
        "launch": measure_launch(),
        "first step": measure_first_step(),
        "steps": _in_child("steps"),
        "logging": _in_child("logging"),
        "fp16": _in_child("fp16"),
    }
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "gpu.json").write_text(json.dumps(results, indent=2))
    report = _report(results)
    (arguments.out / "gpu.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
