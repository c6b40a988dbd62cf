"""``ParallelismConfig`` on real forked ranks (CPU, gloo): HSDP, tensor parallel, their mix.

Each launch checks several things, so the file stays quick: losses equal the one-process loop
on the global batch step by step, the mesh carries Accelerate's dimension names and groups,
the ranks of a TP group read the same batches, weights come home whole, a sharded checkpoint
resumes on another mesh, the launch settings reach the Accelerator, and a failure names the
rank's mesh coordinates. Context parallel needs CUDA: here only its refusal is checked.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.utils.data import DataLoader

import notebook_kit
from notebook_kit import (
    Accelerator,
    FullyShardedDataParallelPlugin,
    ParallelismConfig,
    WorkerError,
    WorkerPool,
    notebook_launcher,
)
from tests.fsdp_models import Block, TinyLM, batches, lm_loss, reference_run
from tests.optional import needs

pytestmark = pytest.mark.integration

STEPS, NO_CLIP = 3, 1e9


def _groups(mesh, names):
    return {name: dist.get_process_group_ranks(mesh[name].get_group()) for name in names}


def _train_hsdp(model, folder):
    hsdp = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(), parallelism_config=hsdp)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    data = torch.cat(batches(STEPS + 1, 1))  # 8 rows a step: 2 for each data-parallel rank
    loader = DataLoader(data[: 8 * STEPS], batch_size=2)
    prepared, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for tokens in loader:
        loss = lm_loss(prepared, tokens)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    mesh = accelerator.torch_device_mesh
    accelerator.save_state(folder)
    # The checkpoint resumes on another mesh: FSDP over all 4 ranks, a fresh model.
    again = Accelerator(
        fsdp_plugin=FullyShardedDataParallelPlugin(),
        parallelism_config=ParallelismConfig(dp_shard_size=4),
    )
    fresh = TinyLM(seed=7)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.05)
    fresh, fresh_optimizer, _ = again.prepare(fresh, fresh_optimizer, DataLoader(data, 2))
    again.load_state(folder)
    rank = again.process_index
    tokens = data[8 * STEPS :][2 * rank : 2 * rank + 2]
    resumed = again.reduce(lm_loss(fresh, tokens).detach(), "mean").item()
    return {
        "losses": losses,
        "resumed": resumed,
        "names": mesh.mesh_dim_names,
        "groups": _groups(mesh, ["dp_replicate", "dp_shard", "dp"]),
        "placements": sorted({str(p.placements) for p in prepared.parameters()}),
        "kind": accelerator.distributed_type.value,
        "ranks": (accelerator.data_parallel_rank, accelerator.data_parallel_shard_rank),
    }


def test_hsdp_trains_like_one_process_and_resumes_on_another_mesh(tmp_path):
    losses, _, _ = reference_run(STEPS + 1, 1, NO_CLIP)
    _, _, trained = reference_run(STEPS, 1, NO_CLIP)
    model = TinyLM()
    got = notebook_launcher(
        _train_hsdp, args=(model, str(tmp_path / "hsdp")), num_processes=4, live=False
    )
    assert max(abs(a - b) for a, b in zip(got["losses"], losses[:STEPS], strict=True)) < 1e-6
    assert abs(got["resumed"] - losses[STEPS]) < 1e-6
    assert got["names"] == ("dp_replicate", "dp_shard")
    assert got["groups"] == {"dp_replicate": [0, 2], "dp_shard": [0, 1], "dp": [0, 1, 2, 3]}
    assert got["placements"] == ["(Replicate(), Shard(dim=0))"]
    assert (got["kind"], got["ranks"]) == ("FSDP", (0, 0))
    for key, value in trained.items():  # gathered over the 2-D mesh, loaded into the kernel's
        assert torch.allclose(model.state_dict()[key], value, atol=1e-6), key


LLAMA = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16,
}  # fmt: skip


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**LLAMA))


def _tokens() -> torch.Tensor:
    return torch.randint(0, 64, (4 * STEPS, 8), generator=torch.Generator().manual_seed(1))


def _llama_reference():
    model = _llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for ids in DataLoader(_tokens(), batch_size=4):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


def _train_tp_fsdp(model):
    from accelerate.parallelism_config import ParallelismConfig as AcceleratesConfig

    try:  # context parallel on CPU: refused before any mesh is built
        Accelerator(
            fsdp_plugin=FullyShardedDataParallelPlugin(),
            parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=2),
        )
        refused = "no error"
    except ValueError as error:
        refused = str(error)
    accelerator = Accelerator(
        fsdp_plugin=FullyShardedDataParallelPlugin(),
        parallelism_config=AcceleratesConfig(dp_shard_size=2, tp_size=2),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(_tokens(), batch_size=2)  # 2 data-parallel ranks: 4 rows a step
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, seen = [], []
    for ids in loader:
        seen.append(ids.tolist())
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    every = [None] * accelerator.num_processes
    dist.all_gather_object(every, seen)
    mesh = accelerator.torch_device_mesh
    return {
        "refused": refused,
        "losses": losses,
        "seen": every,
        "groups": _groups(mesh, ["dp_shard", "tp"]),
        "tp_rank": accelerator.tensor_parallel_rank,
        "split": sum(
            hasattr(p, "placements") and len(p.placements) == 2 for p in model.parameters()
        ),
    }


@needs("transformers", what="a transformers model's tp_plan")
def test_tensor_parallel_with_fsdp_on_a_transformers_model_matches_the_unsplit_one(capsys):
    losses, trained = _llama_reference()
    model = _llama()
    got = notebook_launcher(_train_tp_fsdp, args=(model,), num_processes=4, live=None)
    shown = capsys.readouterr().out  # a mesh made in code, not in the banner: rank 0 shows it
    assert "Mesh dp_shard 2 × tp 2: dp_shard groups [0 2] [1 3]; tp groups [0 1] [2 3]" in shown
    assert "needs CUDA GPUs" in got["refused"]
    assert max(abs(a - b) for a, b in zip(got["losses"], losses, strict=True)) < 1e-5
    assert got["groups"] == {"dp_shard": [0, 2], "tp": [0, 1]}
    assert got["tp_rank"] == 0 and got["split"] > 0  # layers split over tp, then sharded
    seen = got["seen"]
    assert seen[0] == seen[1] and seen[2] == seen[3]  # a TP group reads one batch
    assert seen[0] != seen[2]
    speed = notebook_kit.last_run().speed  # a batch a TP group reads together counts once
    assert speed.samples == 4 * STEPS and speed.ranks[1].samples == 0, speed.ranks
    for key, value in trained.items():  # whole again in the kernel's model
        assert torch.allclose(model.state_dict()[key], value, atol=1e-5), key


PLAN = {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}


class EvenLM(TinyLM):
    """TinyLM with blocks 32 wide, which split evenly over 2 tensor-parallel ranks."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.blocks = torch.nn.ModuleList([Block(hidden=32), Block(hidden=32)])


def _even_reference() -> list[float]:
    model = EvenLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for tokens in batches(STEPS, 1):
        loss = lm_loss(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _train_tp_plain(model, out):
    misspelt = {"blocks.*.upp": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}
    try:  # torch's parallelize_module only warns, and the layer would stay whole
        layers = EvenLM()
        wrong = Accelerator(parallelism_config=ParallelismConfig(tp_plan=misspelt))
        wrong.prepare(layers, torch.optim.SGD(layers.parameters(), lr=0.1))
        refused = "no error"
    except ValueError as error:
        refused = str(error)
    accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_plan=PLAN))  # tp_size: launch
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for tokens in batches(STEPS, 1):
        loss = lm_loss(model, tokens)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    if accelerator.is_main_process:
        split = sorted({str(p.placements) for p in model.parameters() if hasattr(p, "placements")})
        mesh = accelerator.torch_device_mesh.mesh_dim_names
        kind = accelerator.distributed_type.value
        with open(out, "w") as file:
            got = {"losses": losses, "split": split, "mesh": mesh, "kind": kind}
            json.dump({**got, "refused": refused}, file)
    accelerator.wait_for_everyone()
    if accelerator.process_index == 1:
        raise ValueError("rank 1 stops here")


def test_a_plain_model_splits_by_the_users_plan_from_launch_settings_and_failures_name_the_mesh(
    tmp_path,
):
    losses = _even_reference()
    out = tmp_path / "tp.json"
    with pytest.raises(WorkerError) as caught:
        notebook_launcher(
            _train_tp_plain,
            args=(EvenLM(), str(out)),
            num_processes=2,
            parallelism_config_tp_size=2,
            live=False,
        )
    assert str(caught.value).startswith("Rank 1 of 2 (mesh coordinates tp=1) failed")
    got = json.loads(out.read_text())
    assert max(abs(a - b) for a, b in zip(got["losses"], losses, strict=True)) < 1e-6
    assert got["split"] == ["(Replicate(),)", "(Shard(dim=0),)", "(Shard(dim=1),)"]
    assert (got["mesh"], got["kind"]) == (["tp"], "MULTI_CPU")
    assert "tp_plan names ['blocks.*.upp'], which EvenLM does not have" in got["refused"]


def _touch(path):
    open(path, "w").close()  # a rank started


def test_launch_settings_that_cannot_be_laid_out_are_refused_before_anything_starts(tmp_path):
    started = str(tmp_path / "started")
    with pytest.raises(ValueError, match="world size 2") as caught:
        notebook_launcher(
            _touch, (started,), num_processes=2, fsdp=True, parallelism_config_dp_shard_size=4,
            live=False,
        )  # fmt: skip
    assert "dp_shard_size=4" in str(caught.value)
    with pytest.raises(ValueError, match="plain data parallel") as caught:
        notebook_launcher(
            _touch, (started,), num_processes=2, parallelism_config_dp_replicate_size=2,
            live=False,
        )  # fmt: skip
    assert "parallelism_config_dp_shard_size > 1" in str(caught.value)
    with pytest.raises(ValueError, match="cp_size=2 needs CUDA GPUs") as caught:
        notebook_launcher(
            _touch, (started,), num_processes=2, backend="gloo", fsdp=True,
            parallelism_config_cp_size=2, live=False,
        )  # fmt: skip
    assert "parallelism_config_cp_size=1" in str(caught.value)
    assert not os.path.exists(started), "a rank started before the refusal"


def _hsdp_on_nodes():
    accelerator = Accelerator()  # every size from the launch settings
    model = TinyLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    loader = DataLoader(torch.cat(batches(STEPS, 1)), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for tokens in loader:
        loss = lm_loss(model, tokens)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    mesh = accelerator.torch_device_mesh
    every = [None] * accelerator.num_processes
    mine = (int(os.environ["NODE_RANK"]), _groups(mesh, ["dp_replicate", "dp_shard"]))
    dist.all_gather_object(every, mine)
    return {"losses": losses, "every": every}


@pytest.fixture(scope="module")
def cluster_client():
    """A LocalCluster of two worker processes (two nodes), shared by this module's runs."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        yield client


@needs("distributed", what="a cluster run")
def test_hsdp_on_two_cluster_nodes_replicates_across_them_and_shards_within_each(cluster_client):
    losses, _, _ = reference_run(STEPS, 1, NO_CLIP)
    got = notebook_launcher(
        _hsdp_on_nodes,
        cluster=cluster_client,
        num_nodes=2,
        num_processes=2,
        fsdp=True,
        parallelism_config_dp_replicate_size=2,
        parallelism_config_dp_shard_size=2,
        live=False,
    )
    assert max(abs(a - b) for a, b in zip(got["losses"], losses, strict=True)) < 1e-6
    nodes = [node for node, _ in got["every"]]
    assert nodes == [0, 0, 1, 1]
    for _, groups in got["every"]:
        assert len({nodes[rank] for rank in groups["dp_shard"]}) == 1  # shards within a node
        assert {nodes[rank] for rank in groups["dp_replicate"]} == {0, 1}  # replicas span


@needs("distributed", what="a cluster run")
def test_a_mesh_the_probed_nodes_cannot_hold_is_refused_before_any_node_starts(
    cluster_client, tmp_path
):
    started = str(tmp_path / "started")
    hsdp = {"parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 2}
    with pytest.raises(ValueError, match=r"world size 2 \(2 node\(s\) × 1 process") as caught:
        notebook_launcher(
            _touch, (started,), cluster=cluster_client, num_nodes=2, fsdp=True, live=False, **hsdp
        )  # the probe counts one rank on each node (no GPU): 2 ranks for a mesh of 4
    assert "dp_replicate_size=2" in str(caught.value)
    with pytest.raises(ValueError, match=r"world size 2 \(2 node\(s\) × 1 process"):
        WorkerPool(cluster=cluster_client, num_nodes=2, fsdp=True, live=False, **hsdp)
    with pytest.raises(ValueError, match="would span nodes") as caught:
        notebook_launcher(
            _touch, (started,), cluster=cluster_client, num_nodes=2, num_processes=3, fsdp=True,
            parallelism_config_dp_replicate_size=3, parallelism_config_dp_shard_size=2,
            live=False,
        )  # fmt: skip
    assert "dp_shard_size=3, dp_replicate_size=2" in str(caught.value)
    assert not os.path.exists(started), "a rank started before the refusal"
