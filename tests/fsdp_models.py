"""A tiny language model with tied weights and uneven shapes, and its unsharded reference loop.

Shared by the FSDP tests and the FSDP benchmark: the embedding has 11 rows and the blocks'
hidden width is 33, so no tensor splits evenly over 2 or 4 ranks, and the output head shares
the embedding's weight, so sharding must keep the tied pair in one group.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

VOCAB, WIDTH, HIDDEN = 11, 6, 33


class Block(nn.Module):
    """A residual MLP block: the unit ``transformer_based_wrap`` shards on its own."""

    def __init__(self, width: int = WIDTH, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class TinyLM(nn.Module):
    """Embedding, two blocks, and a head tied to the embedding."""

    _no_split_modules: ClassVar[list[str]] = ["Block"]

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden)


def batches(steps: int, micro: int, size: int = 8, length: int = 5) -> list[torch.Tensor]:
    """``steps * micro`` global batches of token ids, the same in every process."""
    generator = torch.Generator().manual_seed(1)
    return [
        torch.randint(0, VOCAB, (size, length), generator=generator) for _ in range(steps * micro)
    ]


def lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def reference_run(steps: int, micro: int, max_norm: float, lr: float = 0.05):
    """The unsharded loop on the global batches: losses, gradient norms and final weights."""
    model = TinyLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    data = batches(steps, micro)
    losses, norms = [], []
    for step in range(steps):
        for index in range(micro):
            loss = lm_loss(model, data[step * micro + index])
            (loss / micro).backward()
            losses.append(loss.item())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        optimizer.step()
        optimizer.zero_grad()
    return losses, norms, model.state_dict()
