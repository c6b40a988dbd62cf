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
