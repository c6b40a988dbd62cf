"""Resuming in a fresh launch gives bit-identical parameters (1 and 2 real processes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from notebook_kit import Accelerator, notebook_launcher, set_seed

pytestmark = pytest.mark.integration

TOTAL_STEPS, SAVE_AT = 7, 4


class _NoisyData(Dataset):
    """Draws from torch's global RNG per sample, like a random augmentation."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int):
        x = torch.full((3,), float(index)) / 24 + 0.01 * torch.randn(3)
        return x, x.sum(dim=0, keepdim=True)


def _train(mode: str, directory: str):
    set_seed(0)
    accelerator = Accelerator()
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.3), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    loader = DataLoader(_NoisyData(), batch_size=4, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    step = 0
    if mode == "resume":
        accelerator.load_state(directory)
        step = SAVE_AT
    while step < TOTAL_STEPS:
        for x, y in loader:
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if mode == "first" and step == SAVE_AT:
                accelerator.save_state(directory)
                return None
            if step == TOTAL_STEPS:
                break
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return accelerator.gather(flat[None])


@pytest.mark.parametrize("num_processes", [1, 2])
def test_resume_in_a_fresh_launch_is_bit_identical(tmp_path, num_processes):
    directory = str(tmp_path / "ckpt")
    straight = notebook_launcher(_train, args=("straight", ""), num_processes=num_processes)
    notebook_launcher(_train, args=("first", directory), num_processes=num_processes)
    resumed = notebook_launcher(_train, args=("resume", directory), num_processes=num_processes)
    assert straight.shape[0] == num_processes
    assert torch.equal(straight, resumed)
    if num_processes == 2:  # saved by 2, resumed by 1 (tests/test_resume_world_size_...)
        one = notebook_launcher(_train, args=("resume", directory), num_processes=1)
        assert one.shape == (1, straight.shape[1])
