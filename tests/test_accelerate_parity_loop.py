"""One complete training loop, run with Accelerate's Accelerator and with ours: same numbers.

Accumulation, gradient clipping, an LR scheduler, a ``DataLoader(shuffle=True)`` over three
epochs, ``save_state`` in the middle of an epoch and a save/load round trip at the end of one —
on 1 and on 2 processes, with the default shuffle and with ``use_seedable_sampler=True``. Then our
run is resumed in fresh processes from the mid-epoch checkpoint and must continue bit-identically.

Needs ``accelerate`` (the ``bench`` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip("accelerate", reason="the parity loop runs Accelerate itself (bench extra)")

from notebook_kit import notebook_launcher
from tests.accelerate_parity_runner import run_in_fork

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EPOCHS = 3
MID_EPOCH = (1, 3)  # (epoch, batch) after which the "mid" checkpoint is saved
# The "boundary" checkpoint is saved inside the loop right after the last batch of epoch 0.


def _api(implementation: str) -> dict[str, Any]:
    if implementation == "accelerate":
        from accelerate import Accelerator
        from accelerate.utils import DataLoaderConfiguration, GradientAccumulationPlugin, set_seed

        return {"Accelerator": Accelerator, "cpu": True, "DataLoaderConfiguration":
                DataLoaderConfiguration, "GradientAccumulationPlugin": GradientAccumulationPlugin,
                "set_seed": set_seed}  # fmt: skip
    import notebook_kit

    return {"Accelerator": notebook_kit.Accelerator, "cpu": True,
            "DataLoaderConfiguration": notebook_kit.DataLoaderConfiguration,
            "GradientAccumulationPlugin": notebook_kit.GradientAccumulationPlugin,
            "set_seed": notebook_kit.set_seed}  # fmt: skip


def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(7)
    # 10 batches of 4, dealt without wrap-around: the last batch is handed out before the
    # sampler is exhausted, which a checkpoint taken right then must account for.
    x = torch.randn(40, 3, generator=generator)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1)


def _setup(api: dict[str, Any], seedable: bool) -> tuple[Any, ...]:
    api["set_seed"](0)
    accelerator = api["Accelerator"](
        cpu=api["cpu"],
        dataloader_config=api["DataLoaderConfiguration"](use_seedable_sampler=seedable),
        gradient_accumulation_plugin=api["GradientAccumulationPlugin"](num_steps=2),
    )
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    loader = DataLoader(_data(), batch_size=4, shuffle=True)
    return accelerator, *accelerator.prepare(model, optimizer, loader, scheduler)


def _train(
    implementation: str, seedable: bool, folder: str, resume: str | None = None
) -> dict[str, Any]:
    """The loop; ``resume`` names the checkpoint to start from (ours only)."""
    api = _api(implementation)
    accelerator, model, optimizer, loader, scheduler = _setup(api, seedable)
    first_epoch, losses = 0, []
    if resume:
        accelerator.load_state(str(Path(folder) / resume))
        first_epoch = loader.epoch
    for epoch in range(first_epoch, EPOCHS):
        for batch, (x, y) in enumerate(loader, start=loader.position if resume else 0):
            resume = False
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 0.5)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            losses.append((epoch, batch, accelerator.gather(loss.detach()[None]).tolist()))
            if (epoch, batch) == MID_EPOCH:
                accelerator.save_state(str(Path(folder) / "mid"))
            if (epoch, batch) == (0, len(loader) - 1):  # before the pass is closed
                accelerator.save_state(str(Path(folder) / "boundary"))
        if epoch == 1:  # a save/load round trip must not change what follows
            end = str(Path(folder) / "end")
            accelerator.save_state(end)
            accelerator.wait_for_everyone()  # Accelerate's save returns before rank 0 wrote
            accelerator.load_state(end)
    trained = accelerator.unwrap_model(model)
    weights = torch.cat([p.detach().flatten() for p in trained.parameters()])
    return {"losses": losses, "weights": weights, "lr": scheduler.get_last_lr()}


def _run(processes: int, *args: Any) -> dict[str, Any]:
    """The loop on CPU (both libraries alike, also where a GPU is present)."""
    if processes == 1:  # in a fork: Accelerate's process-wide state must not stay in pytest
        return run_in_fork(_train, args, timeout=300)
    return notebook_launcher(
        _train, args=args, num_processes=processes, backend="gloo", live=False, timeout=300
    )


@pytest.mark.parametrize("seedable", [False, True], ids=["default-sampler", "seedable-sampler"])
@pytest.mark.parametrize("processes", [1, 2])
def test_same_losses_and_weights_as_accelerate_and_bit_identical_resume(
    processes, seedable, tmp_path
):
    reference = _run(processes, "accelerate", seedable, str(tmp_path / "accelerate"))
    ours = _run(processes, "ours", seedable, str(tmp_path / "ours"))
    assert len(ours["losses"]) == len(reference["losses"]) == EPOCHS * (10 if processes == 1 else 5)
    assert ours["losses"] == reference["losses"], "every step's loss on every rank"
    assert torch.equal(ours["weights"], reference["weights"])
    assert ours["lr"] == reference["lr"]

    last = len(ours["losses"]) // EPOCHS - 1
    for checkpoint, saved_after in (("mid", MID_EPOCH), ("boundary", (0, last))):
        resumed = _run(processes, "ours", seedable, str(tmp_path / "ours"), checkpoint)
        position = [entry[:2] for entry in ours["losses"]].index(saved_after)
        assert resumed["losses"] == ours["losses"][position + 1 :], checkpoint
        assert torch.equal(resumed["weights"], ours["weights"]), checkpoint
