"""What the live view costs a launch in a real Jupyter kernel: the view against ``live=False``.

Run from the repository root::

    .venv/bin/python -m benchmarks.live_view [--rounds 4] [--pairs 4] [--against ../base]

In a kernel started with jupyter_client (the live view draws real widgets there), interleaved
pairs of launches on 2 processes, one with the default live view and one with ``live=False``:

- ``trivial``: ``notebook_launcher`` of a function returning 1, timed in the kernel around the
  call (median over every pair); the goal is the view adding at most 30 ms;
- ``first_step``: from the call to the last rank's first optimizer step of the benchmarks'
  small CNN (wall clocks of the same machine); the goal is at most 1.1x ``live=False``.

A second table says how noisy the run was: each pair's own difference (median and
interquartile range) and the spread of the ``live=False`` launches.

``--against PATH`` runs a second kernel on another checkout (e.g. ``git worktree add ../base
a88ce59``) in the same rounds, interleaved, so a change is judged against its baseline measured
at the same time on the same (possibly busy) machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks._harness import run_cell

ROOT = Path(__file__).resolve().parents[1]
TRIVIAL_EXTRA_MS = 30.0
FIRST_STEP_RATIO = 1.1

SETUP = """
import json, resource, tempfile, time
from notebook_kit import notebook_launcher
from benchmarks._harness import read_report
from benchmarks._tools import _notebook_kit_entry
from benchmarks._workloads import Task

def nothing():
    return 1

def kernel_cpu():
    used = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the kernel
    return used.ru_utime + used.ru_stime

CPU = {}  # the kernel's CPU seconds of the last launch, by kind

def first_step(**live):
    run_dir = tempfile.mkdtemp(prefix="live-view-")
    started, cpu = time.time(), kernel_cpu()
    notebook_launcher(_notebook_kit_entry, args=(Task("first_step", run_dir),), num_processes=2,
                      **live)
    CPU["first"] = kernel_cpu() - cpu
    return max(read_report(run_dir, f"stepped-{rank}") for rank in range(2)) - started

def trivial(**live):
    started, cpu = time.perf_counter(), kernel_cpu()
    notebook_launcher(nothing, num_processes=2, **live)
    CPU["trivial"] = kernel_cpu() - cpu
    return time.perf_counter() - started

nothing_quiet = trivial(live=False); nothing_live = trivial()  # warm both paths once
"""
PAIRS = """
samples = {{f"{{kind}}_{{which}}{{cpu}}": [] for kind in ("trivial", "first")
           for which in ("live", "quiet") for cpu in ("", "_cpu")}}
for pair in range({pairs}):
    order = ("live", "quiet") if pair % 2 == 0 else ("quiet", "live")
    for which in order:
        live = {{}} if which == "live" else {{"live": False}}
        samples[f"trivial_{{which}}"].append(trivial(**live))
        samples[f"trivial_{{which}}_cpu"].append(CPU["trivial"])
    for which in order:
        live = {{}} if which == "live" else {{"live": False}}
        samples[f"first_{{which}}"].append(first_step(**live))
        samples[f"first_{{which}}_cpu"].append(CPU["first"])
print("JSON" + json.dumps(samples))
"""


def _start(root: Path) -> tuple[Any, Any]:
    from jupyter_client.manager import start_new_kernel

    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    manager, client = start_new_kernel(kernel_name="python3", env=env, cwd=str(root))
    run_cell(client, SETUP)
    return manager, client


def _samples(client: Any, pairs: int) -> dict[str, list[float]]:
    text = "".join(
        m["content"].get("text", "") for m in run_cell(client, PAIRS.format(pairs=pairs))
    )
    return json.loads(text.split("JSON", 1)[1].splitlines()[0])


def measure(roots: dict[str, Path], rounds: int, pairs: int) -> dict[str, dict[str, list[float]]]:
    """Every sample, per checkout; each round runs every checkout's kernel in turn."""
    kernels = {name: _start(root) for name, root in roots.items()}
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in roots}
    try:
        for round_index in range(rounds):
            names = list(kernels)
            for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
                for key, values in _samples(kernels[name][1], pairs).items():
                    figures[name].setdefault(key, []).extend(values)
    finally:
        for manager, client in kernels.values():
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    return figures


def report(figures: dict[str, dict[str, list[float]]]) -> str:
    """The table: medians, the view's extra cost, and whether each goal is met."""
    lines = [
        "| checkout | trivial, live=False | trivial, live view | view adds | "
        "first step, live=False | first step, live view | ratio | samples |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, samples in figures.items():
        median = {key: statistics.median(values) for key, values in samples.items()}
        extra = (median["trivial_live"] - median["trivial_quiet"]) * 1000
        ratio = median["first_live"] / median["first_quiet"]
        extra_ok = "ok" if extra <= TRIVIAL_EXTRA_MS else f"over {TRIVIAL_EXTRA_MS:g} ms"
        ratio_ok = "ok" if ratio <= FIRST_STEP_RATIO else f"over {FIRST_STEP_RATIO:g}x"
        lines.append(
            f"| {name} | {median['trivial_quiet'] * 1000:.0f} ms | "
            f"{median['trivial_live'] * 1000:.0f} ms | {extra:+.0f} ms ({extra_ok}) | "
            f"{median['first_quiet'] * 1000:.0f} ms | {median['first_live'] * 1000:.0f} ms | "
            f"{ratio:.2f}x ({ratio_ok}) | {len(samples['trivial_live'])} |"
        )
    return "\n".join(lines) + "\n\n" + noise(figures)


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    low, _, high = statistics.quantiles(values, n=4)
    return low, high


def noise(figures: dict[str, dict[str, list[float]]]) -> str:
    """How noisy the run was: each pair's own difference (the view's launch against the
    ``live=False`` one right beside it), its median and interquartile range, and the spread of
    the ``live=False`` launches themselves; and the kernel's own CPU time per launch (every
    thread of it), which a busy machine does not blur."""
    lines = [
        "| checkout | view adds, per pair: median [IQR] | ratio, per pair: median [IQR] | "
        "live=False spread (IQR / median): trivial, first step | kernel CPU per launch, "
        "live=False → live view: trivial, first step |",
        "|---|---|---|---|---|",
    ]
    for name, samples in figures.items():
        extra = [
            (live - quiet) * 1000
            for live, quiet in zip(samples["trivial_live"], samples["trivial_quiet"], strict=True)
        ]
        ratio = [
            live / quiet
            for live, quiet in zip(samples["first_live"], samples["first_quiet"], strict=True)
        ]
        (e_low, e_high), (r_low, r_high) = _quartiles(extra), _quartiles(ratio)
        spreads = []
        for key in ("trivial_quiet", "first_quiet"):
            low, high = _quartiles(samples[key])
            spreads.append(f"{(high - low) / statistics.median(samples[key]):.0%}")
        cpu = []
        for kind in ("trivial", "first"):
            if f"{kind}_live_cpu" in samples:
                quiet = statistics.median(samples[f"{kind}_quiet_cpu"]) * 1000
                live = statistics.median(samples[f"{kind}_live_cpu"]) * 1000
                cpu.append(f"{quiet:.0f} → {live:.0f} ms")
        lines.append(
            f"| {name} | {statistics.median(extra):+.0f} ms [{e_low:+.0f}, {e_high:+.0f}] | "
            f"{statistics.median(ratio):.2f}x [{r_low:.2f}, {r_high:.2f}] | "
            f"{', '.join(spreads)} | {', '.join(cpu) or 'not measured'} |"
        )
    return "\n".join(lines)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--rounds", type=int, default=4)
    cli.add_argument("--pairs", type=int, default=4, help="live/quiet pairs per round")
    cli.add_argument("--against", type=Path, help="another checkout, measured alongside")
    cli.add_argument("--quick", action="store_true", help="few samples: checks it runs")
    cli.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    arguments = cli.parse_args()
    if arguments.quick:
        arguments.rounds, arguments.pairs = 1, 1
    roots = {"this checkout": ROOT}
    if arguments.against is not None:
        roots[f"{arguments.against}"] = arguments.against.resolve()
    figures = measure(roots, arguments.rounds, arguments.pairs)
    table = report(figures)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    note = f"\n\n{os.cpu_count()} cores, load average {load} at the end (a shared machine).\n"
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "live_view.json").write_text(json.dumps(figures, indent=1))
    (arguments.out / "live_view.md").write_text(table + note)
    print(table + note)


if __name__ == "__main__":
    sys.exit(main())
