"""``python -m benchmarks.fsdp --quick`` runs end to end at tiny sizes, so the benchmark keeps
working as the code changes. Timings are never asserted (the machine may be busy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration


def test_the_fsdp_benchmark_runs_quickly_and_writes_every_section(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.fsdp", "--quick", "--out", str(tmp_path)]
    # Run outside the checkout, so the package comes from PYTHONPATH first (as the mutation
    # check's copy does), this checkout after it.
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [str(ROOT)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    completed = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )

    assert completed.returncode == 0, completed.stderr[-4000:]
    report = (tmp_path / "fsdp.md").read_text()
    assert report.strip() in completed.stdout
    assert "### Per-rank memory" in report and "### Step time on cpu" in report
    # Counted bytes, not a timing: each rank holds exactly half of every tensor at 2 ranks.
    assert "| FSDP2, 2 ranks | 0.1 MiB | 0.50× |" in report, report
    for loop in ("hand-written `fully_shard`", "Accelerator(fsdp_plugin=...)"):
        assert f"| {loop} | " in report, report
    assert "Goal ≤ 1.03×" in report and "## GPU" in report
    leftovers = [
        process.info["pid"]
        for process in psutil.process_iter(["pid", "cmdline"])
        if "benchmarks.fsdp" in " ".join(process.info["cmdline"] or ())
    ]
    assert leftovers == []
