"""A checkpoint saved by N ranks resumes on M: DDP and one process (2→1, 1→2), FSDP2 with Adam
(2→4, 4→2, DCP resharding), and a prepared loader that goes on at the same global sample, so
across the resume every sample of the epoch is seen exactly once."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from notebook_kit import Accelerator, FullyShardedDataParallelPlugin, notebook_launcher
from tests.fsdp_models import TinyLM, batches, lm_loss

pytestmark = pytest.mark.integration

SAMPLES, BATCH = 48, 2


def _ddp_phase(directory: str, steps: int | None) -> dict[str, object]:
    """``steps`` steps then a save (first phase), or a load and the rest of the epoch (None).

    Returns the samples every rank took (gathered), the weights and Adam's step count.
    """
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    data = TensorDataset(torch.arange(float(SAMPLES)).view(-1, 1))
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loaded = None
    if steps is None:
        loaded = accelerator.load_state(directory)
    weight_at_start = accelerator.unwrap_model(model).weight.detach().clone()
    seen: list[torch.Tensor] = []
    for number, (x,) in enumerate(loader, start=1):
        seen.append(accelerator.gather(x.flatten()))
        accelerator.backward(model(x / SAMPLES).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
        if number == steps:
            break
    if steps is not None:
        accelerator.save_state(directory)
    state = optimizer.optimizer.state[next(iter(accelerator.unwrap_model(model).parameters()))]
    return {
        "seen": torch.cat(seen).long().tolist() if seen else [],
        "weight_at_start": weight_at_start,
        "weight": accelerator.unwrap_model(model).weight.detach().clone(),
        "adam_step": int(state["step"]),
        "loaded": loaded is not None,
    }


@pytest.mark.parametrize(("saved_by", "loaded_by", "steps"), [(2, 1, 5), (1, 2, 6)])
def test_ddp_resumes_on_another_world_size_and_sees_every_sample_once(
    tmp_path, saved_by, loaded_by, steps
):
    directory = str(tmp_path / "ckpt")
    first = notebook_launcher(_ddp_phase, args=(directory, steps), num_processes=saved_by)
    second = notebook_launcher(_ddp_phase, args=(directory, None), num_processes=loaded_by)
    assert second["loaded"]
    assert torch.equal(second["weight_at_start"], first["weight"])  # the saved weights
    assert second["adam_step"] == steps + len(second["seen"]) // (BATCH * loaded_by)
    assert len(first["seen"]) == steps * BATCH * saved_by
    together = first["seen"] + second["seen"]
    assert sorted(together) == list(range(SAMPLES)), "a sample was repeated or skipped"


def _fsdp_phase(directory: str, save: bool) -> dict[str, object]:
    """Two Adam steps then a sharded save, or a load; returns the full weights and Adam state."""
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="size_based_wrap", min_num_params=100, state_dict_type="SHARDED_STATE_DICT"
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = TinyLM()
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), 0.05))
    if save:
        rank, size = accelerator.process_index, accelerator.num_processes
        for tokens in batches(2, 1):
            accelerator.backward(lm_loss(model, tokens[rank::size]))
            optimizer.step()
            optimizer.zero_grad()
        accelerator.save_state(directory)
    else:
        accelerator.load_state(directory)
    params = dict(model.named_parameters())
    full = {name: p.detach().full_tensor().clone() for name, p in params.items()}
    moments = {
        name: optimizer.optimizer.state[p]["exp_avg_sq"].full_tensor().clone()
        for name, p in params.items()
    }
    return {"weights": full, "moments": moments}


@pytest.mark.slow
@pytest.mark.parametrize(("saved_by", "loaded_by"), [(2, 4), (4, 2)])
def test_a_sharded_fsdp2_checkpoint_reshards_onto_another_world_size(tmp_path, saved_by, loaded_by):
    directory = str(tmp_path / "sharded")
    saved = notebook_launcher(_fsdp_phase, args=(directory, True), num_processes=saved_by)
    loaded = notebook_launcher(_fsdp_phase, args=(directory, False), num_processes=loaded_by)
    assert saved["weights"].keys() == loaded["weights"].keys()
    for name, value in saved["weights"].items():
        assert torch.equal(loaded["weights"][name], value), name
        assert torch.equal(loaded["moments"][name], saved["moments"][name]), name


def _rng_phase(directory: str, save: bool) -> list[list[float]]:
    """Each rank seeded apart, then a save (what it draws next), or a load (what it draws)."""
    accelerator = Accelerator()
    model = nn.Linear(1, 1)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    if save:
        torch.manual_seed(100 + accelerator.process_index)
        accelerator.save_state(directory)
    else:
        accelerator.load_state(directory)
    drawn = torch.rand(1, 3)
    return accelerator.gather(drawn).tolist()  # one row per rank


def test_on_another_world_size_each_rank_gets_its_own_rng_states_back(tmp_path):
    directory = str(tmp_path / "rng")
    saved = notebook_launcher(_rng_phase, args=(directory, True), num_processes=3)
    loaded = notebook_launcher(_rng_phase, args=(directory, False), num_processes=2)
    assert len({tuple(row) for row in saved}) == 3  # the ranks' generators differ
    assert loaded == saved[:2], "a rank resumed with another rank's RNG states"
