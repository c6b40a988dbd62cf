"""FSDP2's trained weights come home whole into the kernel's model, each tensor its own.

Rank 0 gathers a sharded model one tensor at a time and frees each once written, so the
next tensor of the same shape may be given the same address: a model of many same-shape
layers shows whether the writer still tells them apart.
"""

from __future__ import annotations

import pytest
import torch

from notebook_kit import Accelerator, FullyShardedDataParallelPlugin, notebook_launcher

pytestmark = pytest.mark.integration


def _train_same_shape_layers(model: torch.nn.Module):
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    inputs = torch.randn(4, 64, generator=torch.Generator().manual_seed(accelerator.process_index))
    accelerator.backward(model(inputs).pow(2).mean())
    optimizer.step()
    return accelerator.get_state_dict(model)


def test_the_weights_of_many_same_shape_layers_come_home_each_its_own():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(12)))
    trained = notebook_launcher(_train_same_shape_layers, args=(model,), num_processes=2)
    home = model.state_dict()
    assert home.keys() == trained.keys()
    for key, value in trained.items():
        assert torch.equal(home[key], value), key
