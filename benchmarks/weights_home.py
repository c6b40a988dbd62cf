"""Memory of the trained weights' trip home: the kernel's peak and rank 0's, against the model.

Run from the repository root::

    .venv/bin/python -m benchmarks.weights_home [--size-mib 1024] [--against ../base]

Each measurement is a fresh process, the kernel: it builds a model of ``--size-mib`` (Linear
layers of 16 MiB), launches 2 processes that change every weight (DDP, or FSDP with
``--strategies``) and reads, with the resident-set peak reset right before the launch
(``/proc/self/clear_refs``), how far its memory rose above what it held. Rank 0 resets its own
peak when the function returns; the kernel reads it until rank 0 exits: what sending the
weights cost rank 0. ``--against`` runs the same measurement, interleaved, on another
checkout's package (this file is the measuring script for both), so the figures compare. The
promise (docs/guarantees.md): the kernel's peak at most 1.25 times the model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
LAYER_MIB = 16  # Linear(2048, 2048) in float32


def memory_status(pid: int | str = "self") -> dict[str, int]:
    """A process's resident set now (``VmRSS``) and its peak (``VmHWM``), in bytes."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmHWM", "VmRSS"):
                values[name] = int(value.split()[0]) * 1024
    return values


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS


def _train(model: object, report: str, fsdp: bool) -> int:
    import torch

    from notebook_kit import Accelerator, FullyShardedDataParallelPlugin

    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()) if fsdp else None
    accelerator = accelerator or Accelerator()
    prepared, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with torch.no_grad():
        for parameter in prepared.parameters():
            parameter.add_(1.0)
    if accelerator.process_index == 0:
        _reset_peak()
        Path(report).write_text(f"{os.getpid()} {memory_status()['VmRSS']}")
    return accelerator.process_index


def _watch_rank_0(report: Path, found: list[int]) -> None:
    while not report.exists() or not report.read_text():
        time.sleep(0.001)
    pid, base = (int(value) for value in report.read_text().split())
    top = base
    while True:
        try:
            top = max(top, memory_status(pid)["VmHWM"])
        except (OSError, KeyError):  # gone, or a zombie whose status has no sizes
            break
        time.sleep(0.001)
    found.append(top - base)


def measure(strategy: str, size_mib: int, report: Path) -> dict[str, float]:
    """One launch in this process: the kernel's and rank 0's peaks above their baselines."""
    import torch
    from torch import nn

    from notebook_kit import notebook_launcher

    layers = max(1, size_mib // LAYER_MIB)
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(layers)])
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    first = model[0].weight.detach().clone()
    rank_0: list[int] = []
    threading.Thread(target=_watch_rank_0, args=(report, rank_0), daemon=True).start()
    _reset_peak()
    base = memory_status()["VmRSS"]
    started = time.monotonic()
    call_args = (model, str(report), strategy == "fsdp")
    notebook_launcher(_train, args=call_args, num_processes=2, live=False)
    seconds = time.monotonic() - started
    kernel = memory_status()["VmHWM"] - base
    deadline = time.monotonic() + 30
    while not rank_0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if not torch.equal(model[0].weight, first + 1):
        raise RuntimeError("the trained weights did not come home")
    return {
        "model_mib": size / MIB,
        "kernel_mib": kernel / MIB,
        "rank0_mib": (rank_0[0] if rank_0 else float("nan")) / MIB,
        "seconds": seconds,
    }


def _one(root: Path, strategy: str, size_mib: int, out: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = str(root)
    report = Path(out) / f"rank0-{time.monotonic_ns()}"
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--one",
            strategy,
            "--size-mib",
            str(size_mib),
            "--report",
            str(report),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{strategy} in {root} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(samples: dict[str, dict[str, list[dict[str, float]]]], names: list[str]) -> str:
    lines = [
        "| strategy | checkout | model | kernel peak above baseline | rank 0 peak | launch |",
        "|---|---|---|---|---|---|",
    ]
    for strategy, by_root in samples.items():
        for name in names:
            runs = by_root.get(name, [])
            if not runs:
                continue
            model = runs[0]["model_mib"]
            kernel = statistics.median(run["kernel_mib"] for run in runs)
            rank_0 = statistics.median(run["rank0_mib"] for run in runs)
            seconds = statistics.median(run["seconds"] for run in runs)
            lines.append(
                f"| {strategy} | {name} | {model:,.0f} MiB | {kernel:,.0f} MiB "
                f"({kernel / model:.2f}x) | {rank_0:,.0f} MiB ({rank_0 / model:.2f}x) | "
                f"{seconds:.1f} s |"
            )
    return "\n".join(lines)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--size-mib", type=int, default=1024, help="the model's size")
    cli.add_argument("--strategies", default="ddp,fsdp", help="ddp, fsdp or both")
    cli.add_argument("--against", type=Path, help="another checkout's root, measured too")
    cli.add_argument("--rounds", type=int, default=1)
    cli.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    cli.add_argument("--one", help=argparse.SUPPRESS)  # a measuring child process
    cli.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    arguments = cli.parse_args()
    if arguments.one:
        print(json.dumps(measure(arguments.one, arguments.size_mib, arguments.report)))
        return
    roots = {"this checkout": ROOT}
    if arguments.against is not None:
        roots[str(arguments.against)] = arguments.against.resolve()
    names = list(roots)
    strategies = [s.strip() for s in arguments.strategies.split(",") if s.strip()]
    unknown = set(strategies) - {"ddp", "fsdp"}
    if unknown:
        cli.error(f"--strategies takes ddp and fsdp, got {', '.join(sorted(unknown))}")
    samples: dict[str, dict[str, list[dict[str, float]]]] = {s: {} for s in strategies}
    arguments.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as reports:
        for round_index in range(arguments.rounds):
            order = names if round_index % 2 == 0 else list(reversed(names))
            for strategy in strategies:
                for name in order:
                    run = _one(roots[name], strategy, arguments.size_mib, reports)
                    samples[strategy].setdefault(name, []).append(run)
                    print(strategy, name, run, flush=True)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    text = (
        f"{_table(samples, names)}\n\n{arguments.rounds} round(s), 2 processes, "
        f"{os.cpu_count()} cores, load average {load} at the end.\n"
    )
    print(text)
    (arguments.out / "weights_home.md").write_text(
        f"# The weights' trip home: memory\n\n`python -m benchmarks.weights_home "
        f"--size-mib {arguments.size_mib}"
        + (f" --against {arguments.against}" if arguments.against else "")
        + f"`\n\n{text}"
    )


if __name__ == "__main__":
    main()
