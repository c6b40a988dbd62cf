"""The weights file: what rank 0 writes is what the kernel's model loads, or nothing is loaded."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from notebook_kit.launch.kernel_models import load_home_weights
from notebook_kit.runtime.weights_file import (
    StoredTensor,
    WeightsFile,
    WeightsFileError,
    read_states,
    store_states,
)


class _Odd(nn.Module):
    """Tied weights, a bf16 parameter, a 0-d buffer, a transposed view and extra state."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.low = nn.Parameter(torch.randn(3, 5).to(torch.bfloat16))
        self.register_buffer("count", torch.tensor(7))
        self.register_buffer("flipped", torch.randn(6, 2).t())
        self.note = "first"

    def get_extra_state(self) -> str:
        return self.note

    def set_extra_state(self, state: str) -> None:
        self.note = state


def _trained() -> _Odd:
    model = _Odd()
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if isinstance(tensor, torch.Tensor):
                tensor.add_(1)
    model.note = "trained"
    return model


def test_a_stored_state_loads_into_the_kernels_model_exactly() -> None:
    source, target = _trained(), _Odd()
    with WeightsFile() as home:
        stored = store_states(home.fd, {id(target): source.state_dict()})
        state = stored[id(target)]
        assert isinstance(state["low"], StoredTensor) and state["low"].dtype == "bfloat16"
        assert state["head.weight"] == state["embed.weight"]  # tied: written once
        assert state["_extra_state"] == "trained"  # not a tensor: travels in the message
        load_home_weights({id(target): target}, stored, home.fd)
    for key, value in source.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(target.state_dict()[key], value), key
    assert target.note == "trained"
    assert target.head.weight is target.embed.weight


def test_a_file_shorter_than_rank_0_said_loads_nothing() -> None:
    source, target = _trained(), _Odd()
    before = {
        key: value.clone()
        for key, value in target.state_dict().items()
        if isinstance(value, torch.Tensor)
    }
    with WeightsFile() as home:
        stored = store_states(home.fd, {id(target): source.state_dict()})
        os.ftruncate(home.fd, os.fstat(home.fd).st_size // 2)  # rank 0 died while writing
        with pytest.raises(WeightsFileError, match="holds"):
            load_home_weights({id(target): target}, stored, home.fd)
    for key, value in before.items():
        assert torch.equal(target.state_dict()[key], value), key


def test_the_weights_can_be_read_into_tensors_of_their_own() -> None:
    source = _trained()
    with WeightsFile() as home:
        stored = store_states(home.fd, {1: source.state_dict()})
        copies = read_states(home.fd, stored)
        home.clear()
        assert os.fstat(home.fd).st_size == 0
    for key, value in source.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(copies[1][key], value), key
