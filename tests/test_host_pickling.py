"""What a worker sends home is pickled with every device tensor moved to the CPU.

No GPU here: a tensor subclass that reports another device stands in for a CUDA tensor (the
pickler decides by ``tensor.device`` and moves with ``.cpu()``). tests/gpu has the real one.
"""

from __future__ import annotations

import pickle

import torch

from notebook_kit.worker.host_pickling import dumps_for_kernel


class _OnAnotherDevice(torch.Tensor):
    """Says it lives on cuda:0; ``.detach()`` and ``.cpu()`` give back a plain CPU tensor."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)

    def detach(self) -> torch.Tensor:  # type: ignore[override]
        return torch.Tensor.detach(self.as_subclass(torch.Tensor))

    def cpu(self, *args: object, **kwargs: object) -> torch.Tensor:  # type: ignore[override]
        return torch.Tensor.cpu(self.as_subclass(torch.Tensor))


def _on_device(values: torch.Tensor) -> torch.Tensor:
    return values.clone().as_subclass(_OnAnotherDevice)


def test_device_tensors_anywhere_in_the_value_come_home_on_the_cpu():
    weight = torch.arange(6.0).reshape(2, 3)
    value = {
        "nested": [(_on_device(weight),)],
        "trainable": _on_device(torch.ones(2)).requires_grad_(True),
        "plain": torch.ones(2),
        "number": 3,
    }
    home = pickle.loads(dumps_for_kernel(value))
    moved = home["nested"][0][0]
    assert type(moved) is torch.Tensor and moved.device == torch.device("cpu")
    assert torch.equal(moved, weight)
    trainable = home["trainable"]
    assert trainable.device == torch.device("cpu") and trainable.requires_grad
    assert torch.equal(home["plain"], torch.ones(2)) and home["number"] == 3


def test_by_value_carries_a_class_defined_on_the_workers_that_the_kernel_cannot_import():
    cell = {"__name__": "__main__"}  # as a pool cell defines it: in __main__, nowhere to import
    exec("class Made:\n    def __init__(self):\n        self.weight = torch.ones(2)\n", cell)
    cell["torch"] = torch
    value = cell["Made"]()
    home = pickle.loads(dumps_for_kernel(value, by_value=True))
    assert type(home).__name__ == "Made" and torch.equal(home.weight, torch.ones(2))
