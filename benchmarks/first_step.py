"""Time to the first training step: from the launch call to one optimizer step done on every rank.

Run from the repository root::

    .venv/bin/python -m benchmarks.first_step [--rounds 3] [--repeats 3] [--tools a,b]

Each tool runs in a fresh Python process per round, as in a fresh kernel: the import cell
(the tool's import), then the launch of a small CNN wrapped for DDP on 2 CPU processes taking
one SGD step. Reported per tool: the import cell (the tool's own import; torch is already
imported), the first launch right after it (same cell), the first launch after a 2-second
pause (the next cell), and the median of repeated launches.
Rounds interleave the tools; every figure is the median over rounds, with the ratio to
notebook_kit (higher is slower). ``notebook_kit-template`` launches from a kernel that holds
a process group, so its workers start from the clean template process, which a kernel makes
at ``import notebook_kit`` (here, a plain process, the import does what a kernel's does): the
launches find it importing torch in the background, or ready; later launches reuse it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

TOOLS = ("notebook_kit", "notebook_kit-template", "torch-fork", "accelerate", "fabric")
PAUSE_SECONDS = 2.0


def _variants(repeats: int) -> tuple[tuple[str, float, int], ...]:
    """(label, pause after the import cell, repeated launches) of each fresh process."""
    return (("same cell", 0.0, repeats), ("next cell", PAUSE_SECONDS, 0))


def _launch_once(tool_name: str) -> float:
    """Seconds from the launch call to the last rank's first optimizer step."""
    from benchmarks._harness import new_run_dir, read_report
    from benchmarks._tools import NUM_PROCESSES
    from benchmarks._tools import TOOLS as LAUNCHERS
    from benchmarks._workloads import Task

    run_dir = new_run_dir()
    started = time.time()
    LAUNCHERS[tool_name].launch(Task("first_step", str(run_dir)))
    stepped = [read_report(run_dir, f"stepped-{rank}") for rank in range(NUM_PROCESSES)]
    return max(stepped) - started


def _child(tool_name: str, pause: float, repeats: int) -> None:
    from benchmarks._tools import TOOLS as LAUNCHERS

    started = time.perf_counter()
    if tool_name == "notebook_kit-template":
        _import_as_a_kernel_does()
    LAUNCHERS[tool_name].load()  # the import cell (torch itself is already imported)
    imported = time.perf_counter() - started
    time.sleep(pause)
    first = _launch_once(tool_name)
    again = [_launch_once(tool_name) for _ in range(repeats)]
    repeat = statistics.median(again) if again else None
    print(json.dumps({"import": imported, "first": first, "repeat": repeat}))


def _import_as_a_kernel_does() -> None:
    """``import notebook_kit`` with what it does in a kernel's own process: make the template.

    This child is no kernel, so the import's kernel check is answered for it; the rest (the
    start method's opt-out, the start itself) is the import's own code.
    """
    import notebook_kit  # noqa: F401 - the import cell's own import
    from notebook_kit.launch import template_start
    from notebook_kit.launch.template_choice import get_start_method

    template_start._in_a_kernels_own_process = lambda: True  # type: ignore[attr-defined]
    assert template_start.start_at_import(get_start_method), "no template was made at import"


def _run_child(tool: str, pause: float, repeats: int) -> dict[str, float] | str:
    command = [sys.executable, "-m", "benchmarks.first_step", "--child", tool,
               "--pause", str(pause), "--repeats", str(repeats)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "timed out"
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["failed"])[-1][:120]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _available(tool: str) -> str | None:
    from benchmarks._tools import TOOLS as LAUNCHERS

    return LAUNCHERS[tool].unavailable()


def measure(
    rounds: int, repeats: int, wanted: tuple[str, ...] = TOOLS
) -> dict[str, dict[str, float | str]]:
    """Medians over ``rounds`` of each available tool in ``wanted``, interleaved."""
    tools = [tool for tool in wanted if _available(tool) is None]
    samples: dict[str, dict[str, list[float]]] = {t: {} for t in tools}
    notes: dict[str, str] = {tool: why for tool in wanted if (why := _available(tool))}
    for _ in range(rounds):
        for tool in tools:
            for label, pause, count in _variants(repeats):
                outcome = _run_child(tool, pause, count)
                if isinstance(outcome, str):
                    notes[tool] = outcome
                    continue
                samples[tool].setdefault("import cell", []).append(outcome["import"])
                samples[tool].setdefault(f"first ({label})", []).append(outcome["first"])
                if outcome["repeat"] is not None:
                    samples[tool].setdefault("repeat", []).append(outcome["repeat"])
    results: dict[str, dict[str, float | str]] = {
        tool: {name: statistics.median(values) for name, values in rows.items()}
        for tool, rows in samples.items()
    }
    for tool, why in notes.items():
        results.setdefault(tool, {})["note"] = why
    return results


def _table(results: dict[str, dict[str, float | str]]) -> str:
    columns = ("import cell", "first (same cell)", "first (next cell)", "repeat")
    lines = ["| launcher | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    ours = results.get("notebook_kit", {})
    for tool, row in results.items():
        cells = []
        for column in columns:
            value = row.get(column)
            if not isinstance(value, float):
                cells.append(str(row.get("note", "n/a")))
                continue
            base = ours.get(column)
            ratio = (
                f" (x{value / base:.1f})"
                if isinstance(base, float) and tool != "notebook_kit"
                else ""
            )
            cells.append(f"{value:.3f} s{ratio}")
        lines.append(f"| {tool} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--rounds", type=int, default=3)
    cli.add_argument("--repeats", type=int, default=3)
    cli.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset")
    cli.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    cli.add_argument("--child", help=argparse.SUPPRESS)
    cli.add_argument("--pause", type=float, default=0.0, help=argparse.SUPPRESS)
    arguments = cli.parse_args()
    if arguments.child:
        _child(arguments.child, arguments.pause, arguments.repeats)
        return
    wanted = tuple(arguments.tools.split(","))
    if unknown := set(wanted) - set(TOOLS):
        cli.error(f"--tools: unknown {sorted(unknown)}; choose from {', '.join(TOOLS)}")
    results = measure(arguments.rounds, arguments.repeats, wanted)
    table = _table(results)
    header = (
        "# Time to the first training step (small CNN + DDP, 2 CPU processes, one SGD step)\n\n"
        "Ratios: the tool's time over notebook_kit's (higher is slower).\n\n"
    )
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "first_step.md").write_text(header + table + "\n")
    (arguments.out / "first_step.json").write_text(json.dumps(results, indent=2))
    print(header + table)


if __name__ == "__main__":
    main()
