"""On a real GPU: the speed figures read the allocator's peaks and count tokens of GPU masks.

Every scenario runs in a fresh interpreter (``run_fresh``), standing for a fresh kernel.
"""

from __future__ import annotations

import json

from tests.gpu.conftest import run_fresh

_SCENARIO = """
import json, torch
from torch.utils.data import DataLoader, Dataset
import notebook_kit
from notebook_kit import Accelerator, notebook_launcher

BIG = 256 * 2**20

class Padded(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        mask = torch.zeros(8, dtype=torch.long, device="cuda")
        mask[: index % 8 + 1] = 1
        return {"input_ids": torch.arange(8, device="cuda") * mask, "attention_mask": mask}

def train():
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(Padded(), batch_size=8))
    big = torch.ones(BIG // 4, device=accelerator.device)
    for batch in loader:
        (batch["input_ids"].float() * 2).sum()
    del big

notebook_launcher(train, isolate=True, live=False)
speed = notebook_kit.last_run().speed
rank = speed.ranks[0]
print(json.dumps({"tokens": speed.tokens, "samples": speed.samples, "big": BIG,
                  "allocated": rank.cuda_max_allocated, "reserved": rank.cuda_max_reserved,
                  "kernel_cuda": torch.cuda.is_initialized()}))
"""


def test_gpu_masks_are_counted_and_the_allocator_peaks_are_kept():
    figures = json.loads(run_fresh(_SCENARIO).strip().splitlines()[-1])
    assert figures["tokens"] == sum(index % 8 + 1 for index in range(64))
    assert figures["samples"] == 64
    assert figures["allocated"] >= figures["big"]
    assert figures["reserved"] >= figures["allocated"]
    assert figures["kernel_cuda"] is False


_SPLIT = """
import json, torch
from torch.utils.data import DataLoader, Dataset
import notebook_kit
from notebook_kit import Accelerator, notebook_launcher
from notebook_kit.live.speed import speed_line

WIDTH, BATCHES = 2048, 40

class OnDevice(Dataset):
    def __len__(self):
        return BATCHES * 64 * max(1, min(torch.cuda.device_count(), 2))

    def __getitem__(self, index):
        return torch.randn(WIDTH, device="cuda")

def train():
    accelerator = Accelerator(mixed_precision="bf16")
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, WIDTH)
    )
    params = sum(p.numel() for p in model.parameters())
    notebook_kit.set_flops_per_sample(6 * params)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    loader = DataLoader(OnDevice(), batch_size=64)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # the step clock and the counts never sync
    try:
        for inputs in loader:
            accelerator.backward(model(inputs).float().pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.cuda.set_sync_debug_mode("default")

ranks = max(1, min(torch.cuda.device_count(), 2))
notebook_launcher(train, num_processes=ranks, live=False)
speed = notebook_kit.last_run().speed
print(json.dumps({
    "ranks": {r: [s.timed_steps, s.step, s.data, s.compute, s.wait, s.peak_flops]
              for r, s in speed.ranks.items()},
    "mfu": speed.mfu, "line": speed_line(speed),
}))
"""


def test_gpu_steps_are_split_on_cuda_events_without_a_sync_and_give_an_mfu():
    figures = json.loads(run_fresh(_SPLIT).strip().splitlines()[-1])
    ranks = figures["ranks"]
    for steps, step, data, compute, wait, peak in ranks.values():
        assert steps == 40 and step > 0 and compute > 0 and data is not None
        assert (wait is not None) == (len(ranks) > 1)  # DDP's all-reduce is timed
        assert peak is not None, "this GPU is missing from notebook_kit.runtime.peak_flops"
    assert 0 < figures["mfu"] < 1, figures
    assert "MFU " in figures["line"] and " = data " in figures["line"], figures["line"]
