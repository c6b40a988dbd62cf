"""A kernel for ``benchmarks.escapes``: one launch whose workers start every kind of process.

``python -m benchmarks._escape_kernel VARIANT RUN_DIR``. Each of the 2 workers starts a
``sleep`` in its own process group, one in a new session, an orphaned ``sleep`` (its shell
parent exits at once), and a DataLoader with 2 worker processes; every pid is written to
``RUN_DIR/pids-<rank>``. Then, by variant: ``finish`` returns, ``fail`` raises on rank 1, and
the kill variants train until the benchmark kills this process or its group. After the launch
this process writes the recorded pids still running to ``RUN_DIR/alive-after-launch``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks._harness import is_gone
from benchmarks.escapes import recorded_pids
from notebook_kit import WorkerError, notebook_launcher


class _Slow(Dataset):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.01)
        return torch.zeros(1)


def _note(path: Path, pid: int) -> None:
    with path.open("a") as file:  # one line per process: written as each one starts
        file.write(f"{pid}\n")


def _start_everything(run_dir: str) -> None:
    """In a worker: start one process of each kind and record their pids."""
    rank = int(os.environ["RANK"])
    pids = Path(run_dir) / f"pids-{rank}"
    _note(pids, os.getpid())
    _note(pids, subprocess.Popen(["sleep", "300"]).pid)
    _note(pids, subprocess.Popen(["sleep", "300"], start_new_session=True).pid)
    orphan = Path(run_dir) / f"orphan-{rank}"
    subprocess.run(["sh", "-c", f"sleep 300 & echo $! > {orphan}"], start_new_session=True)
    _note(pids, int(orphan.read_text()))
    loader = DataLoader(
        _Slow(),
        num_workers=2,
        worker_init_fn=lambda worker: _note(pids, os.getpid()),
        persistent_workers=True,
    )
    batches = iter(loader)
    next(batches)
    (Path(run_dir) / f"ready-{rank}").touch()
    return batches  # keeps the DataLoader's processes alive while the worker runs on


def _train(run_dir: str, variant: str) -> str:
    batches = _start_everything(run_dir)
    if variant == "finish":
        return "finished"
    if variant == "fail" and int(os.environ["RANK"]) == 1:
        raise RuntimeError("rank 1 fails with processes running")
    while batches is not None:
        time.sleep(0.1)
    return "unreachable"


def main(variant: str, run_dir: str) -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.suppress(WorkerError):  # the fail variant: what matters is what is left
        notebook_launcher(_train, args=(run_dir, variant), num_processes=2, live=False)
    alive = [pid for pid in recorded_pids(run_dir) if not is_gone(pid)]
    (Path(run_dir) / "alive-after-launch").write_text(json.dumps(alive))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
