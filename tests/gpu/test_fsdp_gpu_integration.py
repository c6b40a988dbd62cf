"""FSDP2 on real GPUs: nccl with a world of one on a single GPU (isolate=True), every rank its
own GPU where there are several, and a CPU run beside GPUs on a gloo mesh of its own.

Each scenario runs in a fresh interpreter (``run_fresh``), standing for a fresh kernel.
"""

from __future__ import annotations

import json

import pytest

from tests.gpu.conftest import GPUS, run_fresh

TRAIN = """
import json, torch
from torch import nn
from notebook_kit import Accelerator, FullyShardedDataParallelPlugin, notebook_launcher

def train(model, cpu=False):
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=64)
    accelerator = Accelerator(fsdp_plugin=plugin, cpu=cpu, mixed_precision="bf16")
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), 1e-2))
    x = torch.randn(16, 32, device=accelerator.device)
    for _ in range(5):
        loss = model(x).square().mean()
        accelerator.backward(loss)
        norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    weight = next(model.parameters())
    return {
        "device": str(weight.device), "type": accelerator.distributed_type.value,
        "backend": torch.distributed.get_backend(), "norm": type(norm).__name__,
        "loss": loss.item(), "world": accelerator.num_processes,
    }

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
before = [p.detach().clone() for p in model.parameters()]
"""


def _result(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_fsdp_on_one_gpu_with_nccl_over_a_world_of_one_brings_the_weights_home():
    out = run_fresh(
        TRAIN
        + """
result = notebook_launcher(train, args=(model,), num_processes=1, isolate=True, live=False)
changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
home = str(next(model.parameters()).device)
print(json.dumps({**result, "changed": changed, "home": home,
                  "kernel_cuda": torch.cuda.is_initialized()}))
"""
    )
    result = _result(out)
    assert result["device"] == "cuda:0" and result["backend"] == "nccl"
    assert result["type"] == "FSDP" and result["norm"] == "float"
    assert result["changed"] and result["home"] == "cpu" and not result["kernel_cuda"]


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs: nccl cannot put two ranks on one GPU")
def test_fsdp_gives_every_rank_its_own_gpu():
    out = run_fresh(
        TRAIN + "print(json.dumps(notebook_launcher(train, args=(model,), num_processes=2)))"
    )
    result = _result(out)
    assert result["world"] == 2 and result["backend"] == "nccl" and result["type"] == "FSDP"


def test_a_cpu_run_beside_gpus_shards_on_a_cpu_mesh():
    out = run_fresh(
        TRAIN
        + """
result = notebook_launcher(train, args=(model, True), num_processes=1, isolate=True,
                           live=False)
print(json.dumps(result))
"""
    )
    result = _result(out)
    assert result["device"] == "cpu" and result["type"] == "FSDP"
