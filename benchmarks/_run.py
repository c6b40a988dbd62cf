"""What ``compare.py`` and ``launch.py`` share: arguments, running the suite, writing files."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import psutil

from benchmarks._chart import save_chart
from benchmarks._harness import MIB, become_subreaper, kill_and_reap, output_to
from benchmarks._measure import Options
from benchmarks._report import machine_description, markdown_table, save_json
from benchmarks._suite import MEASUREMENTS, run_suite
from benchmarks._tools import NUM_PROCESSES, TOOLS

RESULTS = Path(__file__).resolve().parent / "results"
# Quick runs (the harness's own test) use a small dataset and few steps.
QUICK_OPTIONS = Options(dataset_bytes=64 * MIB, warmup=2, steps=5, interrupt_limit=3.0)


def parser(description: str, default_tools: Sequence[str]) -> argparse.ArgumentParser:
    """The command-line options both scripts take."""
    cli = argparse.ArgumentParser(description=description)
    cli.add_argument(
        "--tools",
        default=",".join(default_tools),
        help=f"comma-separated, from: {', '.join(TOOLS)}",
    )
    cli.add_argument(
        "--quick",
        action="store_true",
        help="one repetition of each, small dataset (checks the harness)",
    )
    cli.add_argument("--only", default="", help=f"comma-separated, from: {', '.join(MEASUREMENTS)}")
    cli.add_argument(
        "--dataset-mib",
        type=int,
        default=None,
        help="size of the caller's dataset in the memory measurement",
    )
    cli.add_argument("--out", type=Path, default=RESULTS, help="folder for the table and chart")
    return cli


def choose(
    arguments: argparse.Namespace, plan: dict[str, int]
) -> tuple[list[str], dict[str, int], Options]:
    """Tools, measurement plan and options selected on the command line."""
    tools = [name for name in arguments.tools.split(",") if name]
    unknown = [name for name in tools if name not in TOOLS]
    if unknown:
        sys.exit(f"unknown tools {unknown}; choose from {', '.join(TOOLS)}")
    if arguments.only:
        plan = {name: plan.get(name, 1) for name in arguments.only.split(",") if name}
        if unknown := [name for name in plan if name not in MEASUREMENTS]:
            sys.exit(f"unknown measurements {unknown}; choose from {', '.join(MEASUREMENTS)}")
    options = Options()
    if arguments.quick:
        plan = dict.fromkeys(plan, 1)
        options = QUICK_OPTIONS
    if arguments.dataset_mib:
        options = replace(options, dataset_bytes=arguments.dataset_mib * MIB)
    return tools, plan, options


def execute(
    tools: list[str],
    plan: dict[str, int],
    options: Options,
    out_dir: Path,
    reference: str,
    stem: str,
) -> str:
    """Run the suite, write ``<stem>.md``, ``.json``, ``.png`` and ``.log`` to ``out_dir`` and
    return the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / f"{stem}.log"
    log.unlink(missing_ok=True)
    become_subreaper()
    load_before = os.getloadavg()
    with output_to(log) as console:
        console.write(f"tools: {', '.join(tools)}; tool output goes to {log}\n")
        results = run_suite([TOOLS[name] for name in tools], plan, options, console)
    _check_no_leftovers()
    machine = machine_description(load_before, os.getloadavg())
    setup = (
        f"{NUM_PROCESSES} processes on CPU; repetitions per tool: "
        f"{', '.join(f'{name} {count}' for name, count in plan.items())}; dataset in the "
        f"caller {options.dataset_bytes / MIB:,.0f} MiB; training: batch {options.batch} per "
        f"process, median of {options.steps} steps after {options.warmup} warm-up steps."
    )
    table = markdown_table(results, tools, reference)
    legend = "\n".join(f"- {name}: {TOOLS[name].description}" for name in tools)
    text = f"Machine: {machine}\n\nSetup: {setup}\n\nTools:\n{legend}\n\n{table}\n"
    (out_dir / f"{stem}.md").write_text(text)
    save_json(results, out_dir / f"{stem}.json")
    save_chart(results, tools, out_dir / f"{stem}.png", title=machine)
    return text


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _check_no_leftovers() -> None:
    """The benchmark itself must leave nothing behind: end (and say) whatever is left."""
    left = [
        child.pid
        for child in psutil.Process().children(recursive=True)
        if "resource_tracker" not in " ".join(_cmdline(child))  # spawn's helper exits with us
    ]
    if left:
        print(f"warning: ending {len(left)} leftover process(es): {left}", file=sys.stderr)
        kill_and_reap(left)
