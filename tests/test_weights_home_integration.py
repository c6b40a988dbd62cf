"""The trained weights come home in bounded memory: real launches, real workers, a real model.

A model of 256 MiB goes home from rank 0 into the kernel's (this process's) model. The
kernel's resident-set peak while it comes home is read from ``VmHWM`` after resetting it
(``/proc/self/clear_refs``) just before the launch, or, where that reset is refused, from a
thread sampling the resident set every millisecond. Rank 0 resets its own peak when the
function returns, and this process reads it until rank 0 exits: what rank 0 spends sending
the weights, not what training spent.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks.weights_home import memory_status
from notebook_kit import Accelerator, FullyShardedDataParallelPlugin, notebook_launcher

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)"),
]

MIB = 1 << 20
LAYERS = 16  # of 16 MiB each: 256 MiB in all, no tensor a large share of it
BOUND = 1.25  # the promise: loading adds at most 1.25 times the model to the kernel


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(LAYERS)])


def _size(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # VmHWM := VmRSS
        return True
    except OSError:
        return False


class _PeakAbove:
    """This process's resident-set peak during a block, above what it held when it began."""

    def __init__(self) -> None:
        self.peak = 0
        self._sampled = 0
        self._done = threading.Event()

    def __enter__(self) -> _PeakAbove:
        self._exact = _reset_peak()
        self._base = memory_status()["VmRSS"]
        if not self._exact:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.001):
            self._sampled = max(self._sampled, memory_status()["VmRSS"])

    def __exit__(self, *exc: object) -> None:
        if self._exact:
            top = memory_status()["VmHWM"]
        else:
            self._done.set()
            self._thread.join()
            top = self._sampled
        self.peak = top - self._base


def _trained(model: nn.Module, report: str, plugin: Callable[[], object] | None) -> int:
    """A step's worth of change to every weight; rank 0 then notes where its memory stands."""
    accelerator = Accelerator(fsdp_plugin=plugin()) if plugin else Accelerator()
    prepared, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with torch.no_grad():
        for parameter in prepared.parameters():
            parameter.add_(1.0)
    if accelerator.process_index == 0:
        exact = _reset_peak()
        Path(report).write_text(f"{os.getpid()} {memory_status()['VmRSS']} {int(exact)}")
    return accelerator.process_index


def _rank_0_peak(report: Path, finished: threading.Event) -> list[int]:
    """Rank 0's resident-set peak above what it held when its function returned."""
    found: list[int] = []

    def watch() -> None:
        while not report.exists() or not report.read_text():
            if finished.wait(0.001):
                return
        pid, base, exact = (int(v) for v in report.read_text().split())
        key = "VmHWM" if exact else "VmRSS"
        top = base
        while True:
            try:
                top = max(top, memory_status(pid)[key])
            except (OSError, KeyError):  # gone (or a zombie, whose status has no sizes)
                break
            if finished.is_set() and not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.001)
        found.append(top - base)

    threading.Thread(target=watch, daemon=True).start()
    return found


def _fsdp_plugin() -> FullyShardedDataParallelPlugin:
    return FullyShardedDataParallelPlugin()


@pytest.mark.parametrize(
    ("strategy", "rank_0_bound"),
    [("ddp", 0.5), ("fsdp", BOUND)],
)
def test_the_weights_come_home_adding_at_most_a_quarter_more_than_the_model_to_the_kernel(
    tmp_path: Path, strategy: str, rank_0_bound: float
) -> None:
    """DDP: rank 0 holds the weights already, so sending them adds well under the model (one
    tensor at a time). FSDP: rank 0 gathers the whole model once, and no more (plus the
    parameter being gathered)."""
    model = _model()
    size = _size(model)
    expected = {key: value + 1.0 for key, value in model.state_dict().items()}
    report = tmp_path / "rank0"
    finished = threading.Event()
    plugin = _fsdp_plugin if strategy == "fsdp" else None
    rank_0 = _rank_0_peak(report, finished)
    with _PeakAbove() as kernel:
        rank = notebook_launcher(
            _trained, args=(model, str(report), plugin), num_processes=2, live=False
        )
    finished.set()
    deadline = time.monotonic() + 30
    while not rank_0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rank == 0
    for key, value in expected.items():  # the trained weights did come home
        assert torch.equal(model.state_dict()[key], value), key
    assert kernel.peak <= BOUND * size, (
        f"the kernel's memory rose by {kernel.peak / MIB:.0f} MiB for a "
        f"{size / MIB:.0f} MiB model ({kernel.peak / size:.2f}x)"
    )
    assert rank_0, "rank 0's memory was never read"
    assert rank_0[0] <= rank_0_bound * size, (
        f"rank 0's memory rose by {rank_0[0] / MIB:.0f} MiB sending a {size / MIB:.0f} MiB "
        f"model ({rank_0[0] / size:.2f}x)"
    )
