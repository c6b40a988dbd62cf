"""GPU figures in one command: step time, logging overhead, launch latency, fp16 loss scaling.

Run from the repository root on a machine with a CUDA GPU (about 3 minutes)::

    python -m benchmarks.gpu [--out benchmarks/results]

Writes ``gpu.md`` (and ``gpu.json``) with, all measured in this one run:

* step time in one process (the kernel's case), bf16 autocast, fused AdamW, two MLP sizes:
  a plain hand-written autocast loop (the baseline), notebook_kit's Accelerator and, where
  installed, Hugging Face Accelerate's — interleaved blocks, median per step;
* ``accelerator.log({"loss": loss})`` every step in a forked worker on the GPU, against the
  same loop without it, blocks interleaved in the same worker (goal: at most x1.02);
* launch latency on the GPU (every GPU, nccl, one all_reduce of a GPU tensor) against torch's
  own fork launcher doing the same;
* time to the first optimizer step of a forked worker on the GPU (``isolate=True``), and CUDA
  initialisation on its own, timed in a fresh forked worker that has not touched CUDA yet;
* fp16 runs with GradScaler (SGD and fused AdamW): steps skipped for overflow, final loss.

The CUDA measurements run in child processes, so this process stays free of CUDA and can
fork launches the way a notebook kernel does. Without a GPU it says so and exits 0, so
``python -m pytest tests/gpu && python -m benchmarks.gpu`` is a dry run on a CPU machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
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


def _logging_blocks() -> dict[str, float]:
    """In one worker: blocks with and without ``accelerator.log`` every step, interleaved."""
    import torch

    from notebook_kit import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    model, x, y = _model_and_data(256, 64)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    times: dict[str, list[float]] = {"without log": [], "log every step": []}
    step = 0
    for block in range(2 * BLOCKS + 2):
        logging = block % 2 == 1
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(STEPS_PER_BLOCK):
            loss = (model(x) - y).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if logging:
                accelerator.log({"loss": loss}, step=step)
            step += 1
        torch.cuda.synchronize()
        if block >= 2:  # the first pair warms up
            times["log every step" if logging else "without log"].append(
                (time.perf_counter() - started) / STEPS_PER_BLOCK
            )
    return {name: statistics.median(values) for name, values in times.items()}


def measure_logging() -> dict[str, float]:
    """In a forked worker on the GPU, where the metrics go out through the sender thread."""
    from notebook_kit import notebook_launcher

    return notebook_launcher(_logging_blocks, isolate=True, live=False)


def _fp16_run(fused: bool) -> dict[str, Any]:
    import torch

    from notebook_kit import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    model, x, y = _model_and_data(256, 64)
    if fused:
        optimizer: Any = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    else:
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


def measure_fp16() -> dict[str, Any]:
    return {"SGD": _fp16_run(fused=False), "fused AdamW": _fp16_run(fused=True)}


def _child(section: str) -> None:
    measure = {"steps": measure_steps, "fp16": measure_fp16}
    print(json.dumps(measure[section]()))


# -- measured in this (CUDA-free) process -----------------------------------------------------


def _in_child(section: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--child", section],
        capture_output=True, text=True, timeout=240, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def _all_reduce_on_gpu() -> float:
    """The trivial launch's work: one all_reduce of a GPU tensor in the nccl group."""
    import torch
    import torch.distributed as dist

    total = torch.ones(1, device="cuda")
    dist.all_reduce(total)
    return float(total.item())


def _torch_fork_worker(rank: int, world_size: int, port: int) -> None:
    """torch's own fork launcher, hand-written the usual way: nccl, one all_reduce."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world_size, device_id=device)
    total = torch.ones(1, device="cuda")
    dist.all_reduce(total)
    total.item()
    dist.destroy_process_group()


def _launch_once(tool: str, gpus: int) -> float:
    import torch.multiprocessing as mp

    from benchmarks._harness import free_port
    from notebook_kit import notebook_launcher

    started = time.perf_counter()
    if tool == "notebook_kit":
        # One GPU: a forked worker (isolate) all the same, so both sides fork and use nccl.
        notebook_launcher(_all_reduce_on_gpu, num_processes=gpus, isolate=True, live=False)
    else:
        mp.start_processes(
            _torch_fork_worker, args=(gpus, free_port()), nprocs=gpus, start_method="fork"
        )
    return time.perf_counter() - started


def measure_launch(gpus: int, repeats: int = 10) -> dict[str, float]:
    """Launch latency on the GPU: fork, nccl group, one all_reduce, end; interleaved."""
    times: dict[str, list[float]] = {"notebook_kit": [], "torch-fork": []}
    for tool in times:
        _launch_once(tool, gpus)  # warm-up
    for repeat in range(repeats):
        for tool in list(times)[repeat % 2 :] + list(times)[: repeat % 2]:
            times[tool].append(_launch_once(tool, gpus))
    return {tool: statistics.median(values) for tool, values in times.items()}


def _first_gpu_step() -> dict[str, float]:
    import torch

    from notebook_kit import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    model, x, y = _model_and_data(256, 64)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward((model(x) - y).pow(2).mean())
    optimizer.step()
    torch.cuda.synchronize()
    return {}


def _cuda_init_here() -> float:
    """CUDA initialisation in this worker, which has not touched CUDA (a gloo launch)."""
    import torch

    assert not torch.cuda.is_initialized(), "the worker had initialised CUDA already"
    started = time.perf_counter()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    return time.perf_counter() - started


def measure_first_step(repeats: int = 3) -> dict[str, float]:
    from notebook_kit import notebook_launcher

    steps, inits = [], []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        notebook_launcher(_first_gpu_step, isolate=True, live=False)
        steps.append(time.perf_counter() - started)
        inits.append(notebook_launcher(_cuda_init_here, isolate=True, backend="gloo", live=False))
    return {
        "first": steps[0],
        "repeat": statistics.median(steps[1:]),
        "cuda init (repeat)": statistics.median(inits[1:]),
    }


def _report(results: dict[str, Any]) -> str:
    lines = ["# GPU benchmarks", "", "## Step time, one process, bf16 (median per step)", ""]
    for label, times in results["steps"].items():
        base = times["plain autocast loop"]
        cells = [f"{name} {1000 * t:.3f} ms (x{t / base:.3f})" for name, t in times.items()]
        lines.append(f"- {label}: " + ", ".join(cells))
    logging = results["logging"]
    ratio = logging["log every step"] / logging["without log"]
    lines += [
        "",
        f"## accelerator.log every step, forked worker: x{ratio:.3f} the loop without logging "
        f"({1000 * logging['log every step']:.3f} vs {1000 * logging['without log']:.3f} ms)",
        "",
    ]
    launch, gpus = results["launch"], results["gpus"]
    launch_ratio = launch["notebook_kit"] / launch["torch-fork"]
    lines += [
        f"## Launch on the GPU ({gpus} worker{'s' if gpus > 1 else ''}, nccl, one all_reduce): "
        f"notebook_kit {1000 * launch['notebook_kit']:.1f} ms vs torch fork "
        f"{1000 * launch['torch-fork']:.1f} ms (x{launch_ratio:.2f})",
        "",
    ]
    first = results["first step"]
    lines += [
        f"## Forked worker on the GPU, launch to first optimizer step: first "
        f"{first['first']:.2f} s, repeat {first['repeat']:.2f} s; CUDA initialisation in a "
        f"fresh forked worker {first['cuda init (repeat)']:.2f} s",
        "",
    ]
    for name, fp16 in results["fp16"].items():
        lines.append(
            f"## fp16 with GradScaler, {name}: {fp16['skipped']} of {fp16['steps']} steps "
            f"skipped for overflow, final loss {fp16['final loss']:.4f}"
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
    from notebook_kit.config.environment import gpu_count  # counts without initialising CUDA

    gpus = gpu_count()
    if gpus == 0:
        print("benchmarks.gpu: no CUDA GPU visible here, so nothing to measure (exit 0).")
        return
    results = {
        "gpus": gpus,
        "launch": measure_launch(gpus),
        "first step": measure_first_step(),
        "logging": measure_logging(),
        "steps": _in_child("steps"),
        "fp16": _in_child("fp16"),
    }
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "gpu.json").write_text(json.dumps(results, indent=2))
    report = _report(results)
    (arguments.out / "gpu.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
