"""The shuffle orders of a prepared ``DataLoader(shuffle=True)``, as Accelerate produces them.

Default mode gives the batches Accelerate gives, epoch after epoch:

- on one process the DataLoader's own ``RandomSampler`` order (a fresh seed is drawn from torch's
  global generator at the start of every pass, or the permutation comes from the DataLoader's
  ``generator``);
- on several processes one ``torch.Generator``, seeded from the global generator when the loader
  is prepared, made equal on every process (rank 0's state) at the start of each pass, and
  advanced by every permutation.

Seedable mode (``use_seedable_sampler=True``) draws each epoch's permutation from
``data_seed + epoch`` alone (see :class:`~notebook_kit.accelerator.sharding.EpochRandomSampler`).

Either way a checkpoint holds what the current pass was drawn from, so a resumed pass repeats
the interrupted one exactly and the epochs after it continue as if nothing had happened.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, RandomSampler, Sampler

from notebook_kit.accelerator.operations import broadcast_object, world_size
from notebook_kit.accelerator.sharding import EpochRandomSampler

__all__ = ["ReplayableRandomSampler", "ShuffleSampler", "shuffled_batch_sampler"]


def _draw_seed(generator: torch.Generator | None = None) -> int:
    """One int64 from ``generator`` (the global one if None), as torch's samplers draw seeds."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


class ReplayableRandomSampler(Sampler[int]):
    """Draws exactly what torch's ``RandomSampler`` draws, and can replay a pass it began.

    Args:
        length: Size of the data.
        num_samples: Indices per pass.
        replacement: Sample with replacement.
        generator: Where permutations come from; None: a seed drawn from the global generator
            at the start of each pass, as ``RandomSampler`` does.

    Example:
        >>> sampler = ReplayableRandomSampler(5, 5)
        >>> sorted(sampler) == list(range(5))
        True
    """

    def __init__(
        self,
        length: int,
        num_samples: int,
        replacement: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        self.length = length
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator
        self.pass_seed: int | None = None  # seed of the current pass (no generator)
        self.pass_state: torch.Tensor | None = None  # generator state when the pass began
        self._replay: int | torch.Tensor | None = None

    def __len__(self) -> int:
        return self.num_samples

    def begin_pass(self, epoch: int, resuming: bool, synchronise: bool) -> None:
        """Called before each pass: agree on the generator, note where the pass starts."""
        if self.generator is None:
            return
        if isinstance(self._replay, torch.Tensor):
            self.generator.set_state(self._replay)
        elif synchronise and not resuming and world_size() > 1:
            self.generator.set_state(broadcast_object(self.generator.get_state()))
        self._replay = None
        self.pass_state = self.generator.get_state()

    def __iter__(self) -> Iterator[int]:
        generator = self.generator
        if generator is None:
            replay, self._replay = self._replay, None
            self.pass_seed = int(replay) if replay is not None else _draw_seed()
            generator = torch.Generator().manual_seed(self.pass_seed)
        # Every draw of the pass at once (torch makes the same draws, the last one lazily after
        # the last index): a checkpoint taken after the last batch then holds the generator as
        # the next pass finds it.
        yield from self._draw_pass(generator)

    def _draw_pass(self, generator: torch.Generator) -> list[int]:
        n, count = self.length, self.num_samples
        if self.replacement:
            chunks = [
                torch.randint(n, (size,), dtype=torch.int64, generator=generator)
                for size in [32] * (count // 32) + [count % 32]
            ]
            return torch.cat(chunks).tolist()
        whole = [torch.randperm(n, generator=generator) for _ in range(count // n)]
        tail = torch.randperm(n, generator=generator)[: count % n]
        return torch.cat([*whole, tail]).tolist()

    def state_dict(self, mid_pass: bool) -> dict[str, Any]:
        """What the next pass needs: this pass's source if it is unfinished, else the current."""
        if self.generator is None:
            seed = self.pass_seed if mid_pass and self.pass_seed is not None else -1
            return {"pass_seed": seed}
        state = self.pass_state if mid_pass and self.pass_state is not None else None
        return {"generator": state if state is not None else self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replay the pass ``state`` began, whichever of the two ways it was drawn.

        Several processes draw from one shared generator, one process from a seed per pass:
        a checkpoint saved by one way loads into the other (a resume on another number of
        processes), and the pass goes on over the same permutation.
        """
        if "generator" in state:
            if self.generator is None:
                self.generator = torch.Generator()
            self.generator.set_state(state["generator"])
            self._replay = state["generator"]
            return
        seed = int(state.get("pass_seed", -1))  # torch draws seeds from [0, 2**63)
        if self.generator is None:
            self._replay = seed if seed >= 0 else None
        elif seed >= 0:  # the seed's own generator draws what the pass drew
            self._replay = torch.Generator().manual_seed(seed).get_state()
            self.generator.set_state(self._replay)


class _SeedableSampler(EpochRandomSampler):
    """The seedable mode's sampler with the same pass hooks as the default one."""

    def begin_pass(self, epoch: int, resuming: bool, synchronise: bool) -> None:
        self.set_epoch(epoch)

    def state_dict(self, mid_pass: bool) -> dict[str, Any]:
        return {"seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state.get("seed", -1)) >= 0:
            self.seed = int(state["seed"])


ShuffleSampler = ReplayableRandomSampler | _SeedableSampler


def _plain_shuffle(sampler: Any) -> bool:
    return type(sampler) is RandomSampler


def shuffled_batch_sampler(
    batch_sampler: Any,
    *,
    num_processes: int,
    use_seedable_sampler: bool,
    data_seed: int | None,
) -> tuple[Any, ShuffleSampler | None]:
    """``batch_sampler`` with a plain ``RandomSampler`` inside replaced by one of ours.

    Returns the batch sampler to shard and the shuffle sampler (None when the data is not
    shuffled by a plain RandomSampler: custom samplers are left alone).

    Example::

        loader = DataLoader(range(10), batch_size=2, shuffle=True)
        batches, shuffle = shuffled_batch_sampler(loader.batch_sampler, num_processes=1,
            use_seedable_sampler=False, data_seed=None)
    """
    if type(batch_sampler) is not BatchSampler or not _plain_shuffle(batch_sampler.sampler):
        return batch_sampler, None
    original: RandomSampler = batch_sampler.sampler
    length = len(original.data_source)
    shuffle: ShuffleSampler
    if use_seedable_sampler:
        seed = data_seed if data_seed is not None else torch.initial_seed()
        # Rank 0's seed wins, so ranks seeded differently still deal from one permutation.
        shuffle = _SeedableSampler(length, int(broadcast_object(seed)))
        if original.replacement or original.num_samples != length:
            raise ValueError(
                "use_seedable_sampler=True shuffles each sample once per epoch; it cannot "
                "replace a RandomSampler with replacement=True or num_samples set."
            )
    else:
        generator = original.generator
        if generator is None and num_processes > 1 and dist.is_initialized():
            # One generator for all processes, seeded like Accelerate seeds it.
            generator = torch.Generator().manual_seed(_draw_seed())
        shuffle = ReplayableRandomSampler(
            length, original.num_samples, original.replacement, generator
        )
    rebuilt = BatchSampler(shuffle, batch_sampler.batch_size, batch_sampler.drop_last)
    return rebuilt, shuffle
