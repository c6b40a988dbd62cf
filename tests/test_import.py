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


_SET_ON_IMPORT = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1", "GRPC_ENABLE_FORK_SUPPORT": "false"}


def test_import_initialises_neither_cuda_nor_a_process_group():
    environment = {k: v for k, v in os.environ.items() if k not in _SET_ON_IMPORT}
    command = [sys.executable, "-c", PROBE]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 0, done.stderr
    # The variables set keep forks safe: torch.cuda.is_available() asks NVML instead of the
    # driver, and gRPC starts no threads in a forked child.
    assert done.stdout.split("\n")[:3] == ["False", repr(sorted(_SET_ON_IMPORT)), "False"]


def test_the_documented_module_paths_import_and_the_script_entry_runs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('ran', sys.argv[1:])\n")
    probe = (
        "from notebook_kit.accelerator.configuration import ProjectConfiguration\n"
        "from notebook_kit.cli.export import export_notebook\n"
        "from notebook_kit.runtime import current_launch\n"
        "print(ProjectConfiguration.__module__, export_notebook.__module__, current_launch())\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "notebook_kit.accelerator.configuration",
        "notebook_kit.cli.export",
        "None",
    ]
    command = [sys.executable, "-m", "notebook_kit.cli.script_entry", str(script), "--lr", "0.1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran ['--lr', '0.1']\n"


SIDE_EFFECTS_PROBE = """
import os, sys
environ, meta_path = dict(os.environ), list(sys.meta_path)
import notebook_kit
changed = {k: v for k, v in os.environ.items() if environ.get(k) != v}
gone = sorted(set(environ) - set(os.environ))
print(repr((changed, gone, [type(f).__qualname__ for f in sys.meta_path if f not in meta_path])))
"""


def test_importing_the_package_changes_only_the_documented_environment_variables():
    """The NVML guard and gRPC's fork support (their reasons are in
    ``notebook_kit/__init__.py``), and nothing else."""
    environment = {k: v for k, v in os.environ.items() if k not in _SET_ON_IMPORT}
    command = [sys.executable, "-c", SIDE_EFFECTS_PROBE]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr((_SET_ON_IMPORT, [], []))
    environment.update(PYTORCH_NVML_BASED_CUDA_CHECK="0", GRPC_ENABLE_FORK_SUPPORT="true")
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=environment)
    assert done.stdout.strip() == repr(({}, [], [])), done.stderr  # the user's choices are kept


HEAVY = """
import sys, torch
from notebook_kit import Accelerator, FullyShardedDataParallelPlugin, notebook_launcher
heavy = ("torch.distributed.fsdp", "distributed", "dask", "ipywidgets", "IPython", "matplotlib")
print(sorted(name for name in heavy if name in sys.modules))
"""


def test_the_import_cell_leaves_fsdp_dask_and_widgets_to_the_runs_that_use_them():
    """Half a second of torch.distributed.fsdp (and Dask) would be every notebook's to pay.

    The widgets (and IPython, which ipywidgets imports) load with the first live view, so a
    script, a ``live=False`` run or a torchrun worker never pays for them.
    """
    done = subprocess.run([sys.executable, "-c", HEAVY], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
