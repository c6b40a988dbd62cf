"""The benchmark harness runs end to end: one quick repetition of every measurement for
notebook_kit and raw torch. Timings are never asserted (the machine may be busy)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # benchmarks/ is a folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks._report import METRICS, markdown_table  # noqa: E402
from benchmarks._suite import Cell  # noqa: E402
from tests.optional import needs  # noqa: E402

QUICK_TOOLS = ("notebook_kit", "torch-fork")
PNG_MAGIC = b"\x89PNG"


def _run_benchmark(script: str, out: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        f"benchmarks.{script}",
        "--quick",
        "--tools",
        ",".join(QUICK_TOOLS),
        "--out",
        str(out),
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=170)


def _processes_mentioning(text: str) -> list[int]:
    """Processes whose command line names ``text`` (forked workers keep the caller's)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if any(text in part for part in process.info["cmdline"] or ()):
            found.append(process.info["pid"])
    return found


@pytest.mark.integration
def test_compare_quick_writes_every_row_table_and_chart(tmp_path: Path) -> None:
    completed = _run_benchmark("compare", tmp_path)

    assert completed.returncode == 0, completed.stderr[-4000:]
    results = json.loads((tmp_path / "compare.json").read_text())
    assert set(results) == set(METRICS)
    for metric, cells in results.items():
        for tool in QUICK_TOOLS:
            cell = cells[tool]
            assert cell["values"] or cell["na"], f"{metric}/{tool} has neither a value nor n/a"
    table = (tmp_path / "compare.md").read_text()
    assert table.strip() in completed.stdout
    assert "leftover" not in completed.stderr
    for metric in METRICS.values():
        assert metric.title in table
    assert (tmp_path / "compare.png").read_bytes().startswith(PNG_MAGIC)
    assert _processes_mentioning(str(tmp_path)) == []


@pytest.mark.integration
def test_launch_benchmark_quick_reports_ratios_to_the_baseline(tmp_path: Path) -> None:
    completed = _run_benchmark("launch", tmp_path)

    assert completed.returncode == 0, completed.stderr[-4000:]
    table = (tmp_path / "launch.md").read_text()
    assert "vs torch-fork" in table
    assert "% of the 64 MiB dataset" in completed.stdout
    results = json.loads((tmp_path / "launch.json").read_text())
    assert {"launch_first", "launch_repeat", "fail_time", "mem_uss"} <= set(results)
    assert _processes_mentioning(str(tmp_path)) == []


def test_table_shows_na_with_reason_and_ratios_to_the_reference() -> None:
    results = {
        "launch_repeat": {
            "notebook_kit": Cell(values=[0.05, 0.04, 0.06]),
            "torch-fork": Cell(values=[0.1]),
            "accelerate": Cell(na="accelerate is not installed"),
        },
        "interrupt_caller": {
            "notebook_kit": Cell(values=[0.01]),
            "torch-fork": Cell(values=[float("inf")], notes=["2 worker(s) still running"]),
        },
    }

    table = markdown_table(results, ["notebook_kit", "torch-fork", "accelerate"], "notebook_kit")

    assert "| accelerate | n/a |" in table and "accelerate is not installed" in table
    assert "| notebook_kit | 50 | 40–60 | ×1.00 | 3 |" in table
    assert "| torch-fork | 100 | 100–100 | ×2.00 | 1 |" in table
    assert "| torch-fork | not stopped | — | — | 1 | 2 worker(s) still running |" in table


@pytest.mark.integration
def test_first_step_benchmark_reports_every_column_with_ratios(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.first_step", "--rounds", "1", "--repeats", "1"]
    tools = ["--tools", ",".join(QUICK_TOOLS), "--out", str(tmp_path)]
    completed = subprocess.run(
        [*command, *tools], cwd=ROOT, capture_output=True, text=True, timeout=170
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = json.loads((tmp_path / "first_step.json").read_text())
    columns = {"import cell", "first (same cell)", "first (next cell)", "repeat"}
    assert sorted(results) == sorted(QUICK_TOOLS)
    for tool in QUICK_TOOLS:
        assert set(results[tool]) == columns, results[tool]
        assert all(value > 0 for value in results[tool].values())
    assert "| torch-fork |" in completed.stdout and " (x" in completed.stdout


@pytest.mark.integration
@needs("transformers", "accelerate", what="the Trainer benchmark")
def test_trainer_benchmark_measures_all_three_launches(tmp_path: Path) -> None:
    out = tmp_path / "trainer_live.json"
    command = [sys.executable, "-m", "benchmarks.trainer_live", "--steps", "10", "--rounds", "1"]
    completed = subprocess.run(
        [*command, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=170
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    rates = json.loads(out.read_text())["rates"]
    assert sorted(rates) == sorted(
        ["notebook_kit live", "notebook_kit live=False", "Accelerate notebook_launcher"]
    )
    assert all(len(values) == 1 and values[0] > 0 for values in rates.values())
    assert "live / Accelerate notebook_launcher:" in completed.stdout


def test_live_view_report_says_whether_each_goal_is_met() -> None:
    from benchmarks.live_view import report

    quiet = {"trivial_quiet": [0.080, 0.090], "first_quiet": [1.0, 1.0]}
    met = {**quiet, "trivial_live": [0.100, 0.110], "first_live": [1.05, 1.05]}
    missed = {**quiet, "trivial_live": [0.300, 0.330], "first_live": [1.3, 1.3]}
    lines = report({"new": met, "old": missed}).splitlines()
    assert "+20 ms (ok)" in lines[2] and "1.05x (ok)" in lines[2]
    assert "+230 ms (over 30 ms)" in lines[3] and "1.30x (over 1.1x)" in lines[3]


def test_versions_reads_the_step_overhead_ratios() -> None:
    from benchmarks.versions import STEP_RATIO

    line = (
        "2 processes, DDP: median step hand-written 1.000 ms, Accelerator 1.020 ms; "
        "ratio Accelerator/hand-written: wall 1.020, CPU time 1.010"
    )
    match = STEP_RATIO.match(line)
    assert match is not None and (match["label"], match["wall"]) == ("2 processes, DDP", "1.020")


def test_the_gpu_benchmark_reports_every_figure_and_says_when_there_is_no_gpu() -> None:
    """On a CPU machine only the measuring is skipped: the report it would write is built here
    from figures of the shape the measurements return, and the command itself exits 0."""
    from benchmarks import gpu

    sizes = list(gpu.SIZES)
    loops = ("plain autocast loop", "notebook_kit Accelerator", "Accelerate Accelerator")
    results = {
        "gpus": 2,
        "launch": {"notebook_kit": 0.120, "torch-fork": 0.100},
        "first step": {"first": 3.1, "repeat": 0.9, "cuda init (repeat)": 0.4},
        "logging": {"log every step": 0.00102, "without log": 0.00100},
        "steps": {
            label: {name: 0.001 * (i + 1) for i, name in enumerate(loops)} for label in sizes
        },
        "fp16": {"SGD": {"steps": 200, "skipped": 3, "final loss": 0.25}},
    }
    report = gpu._report(results)
    assert f"- {sizes[0]}: plain autocast loop 1.000 ms (x1.000)" in report
    assert "notebook_kit Accelerator 2.000 ms (x2.000)" in report
    assert "accelerator.log every step, forked worker: x1.020" in report
    assert (
        "(2 workers, nccl, one all_reduce): notebook_kit 120.0 ms vs torch fork 100.0 ms (x1.20)"
        in report
    )
    assert "CUDA initialisation in a fresh forked worker 0.40 s" in report
    assert "fp16 with GradScaler, SGD: 3 of 200 steps skipped for overflow" in report
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no CUDA GPU visible here" in done.stdout


@pytest.mark.integration
def test_step_overhead_runs_every_comparison_with_its_ratio() -> None:
    command = [sys.executable, "-m", "benchmarks.step_overhead", "--steps", "8", "--blocks", "2"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-4000:]
    for label in ("2 processes, DDP: ", "1 process, plain loop: ", "speed measurements: "):
        assert label in done.stdout, done.stdout
    assert "ratio on/off: wall " in done.stdout, done.stdout
