"""Importing notebook_kit must leave the kernel fork-safe."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import os, sys, torch
before = dict(os.environ)
import notebook_kit
import notebook_kit.launch.launcher, notebook_kit.worker.entry, notebook_kit.launch.preflight
print(torch.cuda.is_initialized())
print(sorted(set(os.environ) - set(before)))
import torch.distributed as dist
print(dist.is_initialized())
"""


def test_import_initialises_neither_cuda_nor_a_process_group():
    environment = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    command = [sys.executable, "-c", PROBE]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 0, done.stderr
    # The one variable set makes torch.cuda.is_available() ask NVML instead of the driver.
    assert done.stdout.split("\n")[:3] == ["False", "['PYTORCH_NVML_BASED_CUDA_CHECK']", "False"]


def test_module_paths_shown_in_earlier_documentation_still_import(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('ran', sys.argv[1:])\n")
    probe = (
        "from notebook_kit.accelerator_checkpoints import ProjectConfiguration\n"
        "from notebook_kit.export import export_notebook\n"
        "from notebook_kit.runtime import current_launch\n"
        "import notebook_kit.cli.export, notebook_kit.export\n"
        "assert notebook_kit.export is notebook_kit.cli.export\n"
        "assert notebook_kit.cli.export.__spec__.name == 'notebook_kit.cli.export'\n"
        "print(ProjectConfiguration.__module__, export_notebook.__module__, current_launch())\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "notebook_kit.accelerator.configuration",
        "notebook_kit.cli.export",
        "None",
    ]
    command = [sys.executable, "-m", "notebook_kit.script_entry", str(script), "--lr", "0.1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran ['--lr', '0.1']\n"
