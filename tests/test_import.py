"""Importing notebook_kit must leave the kernel fork-safe."""

from __future__ import annotations

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


def test_import_initialises_neither_cuda_nor_a_process_group_nor_environment():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["False", "[]", "False"]
