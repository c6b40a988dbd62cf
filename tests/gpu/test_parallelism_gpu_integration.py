"""``ParallelismConfig`` on GPUs with nccl: HSDP, tensor parallel and context parallel.

NCCL puts one rank on each GPU, so each scenario needs as many GPUs as ranks and is skipped,
with the count it needs, on a machine with fewer. Each runs in a fresh interpreter (a fresh
kernel) and compares against the same model trained in one process on the global batch.
"""

from __future__ import annotations

import json

import pytest

from tests.gpu.conftest import GPUS, run_fresh

COMMON = """
import json, torch
import torch.nn.functional as F
from notebook_kit import (Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig,
                          notebook_launcher)

LLAMA = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             attn_implementation="sdpa")

def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**LLAMA))

def tokens(rows, length=32):
    return torch.randint(0, 128, (rows, length), generator=torch.Generator().manual_seed(1))

def reference(rows, steps):
    model = llama().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for ids in tokens(rows * steps).split(rows):
        ids = ids.cuda()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        losses.append(loss.item())
    return losses

def train(sizes, rows, steps, cp=False):
    accelerator = Accelerator(
        fsdp_plugin=FullyShardedDataParallelPlugin() if sizes.get("dp_shard_size", 1) > 1
        or sizes.get("cp_size", 1) > 1 else None,
        parallelism_config=ParallelismConfig(**sizes))
    model = llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    shards = sizes.get("dp_replicate_size", 1) * sizes.get("dp_shard_size", 1)
    loader = torch.utils.data.DataLoader(tokens(rows * steps), batch_size=rows // shards)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for ids in loader:
        labels = ids.clone()
        if cp:  # each cp rank holds a slice of the sequence; ring attention sees all of it
            shift = torch.full_like(labels[:, :1], -100)
            targets = torch.cat([labels[:, 1:], shift], dim=1)
            with accelerator.maybe_context_parallel(buffers=[ids, targets],
                                                    buffer_seq_dims=[1, 1]):
                logits = model(input_ids=ids).logits
                # Each rank's mean over its slice; FSDP averages the gradients over cp.
                loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                                       ignore_index=-100)
        else:
            loss = model(input_ids=ids, labels=labels).loss
        accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    return {"losses": losses, "type": accelerator.distributed_type.value,
            "backend": torch.distributed.get_backend(),
            "names": list(accelerator.torch_device_mesh.mesh_dim_names)}
"""


def _run(launch: str) -> dict:
    out = run_fresh(COMMON + launch, timeout=420)
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(GPUS < 4, reason="needs 4 GPUs: HSDP 2 x 2, one nccl rank per GPU")
def test_hsdp_on_four_gpus_trains_like_one_gpu_on_the_global_batch():
    got = _run("""
ref = reference(8, 3)
got = notebook_launcher(train, args=({"dp_replicate_size": 2, "dp_shard_size": 2}, 8, 3),
                        num_processes=4, live=False)
print(json.dumps({**got, "ref": ref}))
""")
    assert got["backend"] == "nccl" and got["type"] == "FSDP"
    assert got["names"] == ["dp_replicate", "dp_shard"]
    assert max(abs(a - b) for a, b in zip(got["losses"], got["ref"], strict=True)) < 1e-3


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs: TP 2, one nccl rank per GPU")
def test_tensor_parallel_on_two_gpus_matches_the_unsplit_model():
    got = _run("""
ref = reference(4, 3)
got = notebook_launcher(train, args=({"tp_size": 2}, 4, 3), num_processes=2, live=False)
print(json.dumps({**got, "ref": ref}))
""")
    assert got["names"] == ["tp"] and got["type"] == "MULTI_GPU"
    assert max(abs(a - b) for a, b in zip(got["losses"], got["ref"], strict=True)) < 1e-3


@pytest.mark.skipif(GPUS < 4, reason="needs 4 GPUs: TP 2 x FSDP 2, one nccl rank per GPU")
def test_tensor_parallel_with_fsdp_on_four_gpus_matches_the_unsplit_model():
    got = _run("""
ref = reference(4, 3)
got = notebook_launcher(train, args=({"dp_shard_size": 2, "tp_size": 2}, 4, 3),
                        num_processes=4, live=False)
print(json.dumps({**got, "ref": ref}))
""")
    assert got["names"] == ["dp_shard", "tp"] and got["type"] == "FSDP"
    assert max(abs(a - b) for a, b in zip(got["losses"], got["ref"], strict=True)) < 1e-3


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs: CP 2 (ring attention), one rank per GPU")
def test_context_parallel_on_two_gpus_matches_the_whole_sequence():
    got = _run("""
ref = reference(2, 3)
got = notebook_launcher(train, args=({"cp_size": 2}, 2, 3, True), num_processes=2, live=False)
print(json.dumps({**got, "ref": ref}))
""")
    assert got["names"] == ["cp"] and got["type"] == "FSDP"
    assert max(abs(a - b) for a, b in zip(got["losses"], got["ref"], strict=True)) < 2e-2


def test_context_parallel_without_a_group_warns_and_runs_the_block_on_one_gpu():
    got = _run("""
def one():
    import warnings
    accelerator = Accelerator()
    model = accelerator.prepare(llama())
    ids = tokens(2).to(accelerator.device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1]):
            loss = model(input_ids=ids, labels=ids).loss
    return {"device": str(ids.device), "warned": any("no effect" in str(w.message) for w in caught),
            "finite": bool(torch.isfinite(loss).item())}
print(json.dumps(notebook_launcher(one, num_processes=1, isolate=True, live=False)))
""")
    assert got == {"device": "cuda:0", "warned": True, "finite": True}
