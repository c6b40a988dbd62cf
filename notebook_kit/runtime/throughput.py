"""Worker side of the speed figures: samples, tokens and batches counted, and peak memory.

The training thread only counts: a batch's first dimension (its shape, never its values), a
reference to its ``attention_mask``, an integer add. The metrics sender thread does the rest
when it sends a batch (:class:`notebook_kit.runtime.metrics.WorkerChannel`): it sums the
attention masks (a mask on a GPU was summed there without a sync and arrives like a logged GPU
value, as a :class:`~notebook_kit.runtime.metrics.DeviceScalar`), and reads the peak memory
of the process and of its GPU. The kernel turns what every rank counted into rates
(:mod:`notebook_kit.live.speed`).

Only one loader counts per rank: the first prepared loader iterated (the training loader), so
evaluation passes do not add samples. ``notebook_kit.log(..., samples=n)`` counts instead of
the loader, from its first call on.
"""

from __future__ import annotations

import collections
import resource
import sys
import time
from collections.abc import Mapping
from typing import Any

from notebook_kit.runtime.messages import RankSpeed

__all__ = ["SpeedCounter", "batch_size", "batch_tokens"]

_SPEED_INTERVAL = 0.5  # seconds between two speed updates of a rank, when only counts changed


class SpeedCounter:
    """One rank's counts: bumped by the training thread, read by the metrics thread.

    Example::

        counter = SpeedCounter(device="cpu", local_rank=0)
        counter.count_batch({"input_ids": ids, "attention_mask": mask}, loader)
        counter.snapshot().samples
    """

    def __init__(self, device: str = "cpu", local_rank: int = 0) -> None:
        self.samples = 0
        self.batches = 0
        self.first: float | None = None  # when the first batch was counted
        self.ended: float | None = None  # when the function returned
        self.source: int | None = None  # id of the loader whose batches count
        self.explicit = False  # log(samples=...) counts, not the loader
        self.tokens: int | None = None
        self.pending: collections.deque[Any] = collections.deque()  # token counts not yet read
        self.cuda_index = local_rank if device == "cuda" else None
        self.sent: RankSpeed | None = None
        self.sent_at = 0.0

    def count_batch(self, batch: Any, loader: object) -> None:
        """Count a batch a prepared loader handed out (training thread: shapes only)."""
        if self.explicit:
            return
        if self.source is None:
            self.source = id(loader)
        elif self.source != id(loader):
            return  # another loader (evaluation) is being iterated
        self._count(batch_size(batch), batch_tokens(batch))

    def count_samples(self, samples: int) -> None:
        """Count ``samples`` given to ``log``; from the first call on, the loader's counts stop."""
        if not self.explicit:
            self.explicit = True
            self.samples = self.batches = 0
            self.first, self.tokens = None, None
            self.pending.clear()
        self._count(samples, None)

    def _count(self, samples: int, tokens: Any) -> None:
        if self.first is None:
            self.first = time.monotonic()
        self.samples += samples
        self.batches += 1
        if tokens is not None:
            self.pending.append(tokens)

    def snapshot(self, wait: bool = False) -> RankSpeed:
        """The counts so far and the memory peaks (metrics thread); GPU token counts not yet
        arrived are left for the next snapshot unless ``wait``."""
        self._read_tokens(wait)
        now = self.ended if self.ended is not None else time.monotonic()
        allocated, reserved = self._cuda_peaks()
        return RankSpeed(
            samples=self.samples,
            batches=self.batches,
            tokens=self.tokens,
            seconds=0.0 if self.first is None else max(now - self.first, 0.0),
            peak_memory_bytes=peak_resident_bytes(),
            cuda_max_allocated=allocated,
            cuda_max_reserved=reserved,
        )

    def may_send(self, now: float, wait: bool) -> bool:
        """Whether to take a snapshot now: not sooner than ``_SPEED_INTERVAL`` after the last
        one sent (a run in the kernel sends at every ``log`` call), except at the end."""
        return wait or self.sent is None or now - self.sent_at >= _SPEED_INTERVAL

    def changed(self, speed: RankSpeed, wait: bool) -> bool:
        """Whether ``speed`` says something new (at the end, the final window too)."""
        sent = self.sent
        if sent is None or _counts(sent) != _counts(speed):
            return True
        return wait and sent.seconds != speed.seconds

    def _read_tokens(self, wait: bool) -> None:
        pending = self.pending
        while pending:
            item = pending[0]
            if not wait and hasattr(item, "ready") and not item.ready():
                return  # still on its way from the GPU
            pending.popleft()
            try:
                count = int(item) if isinstance(item, int) else _read_count(item)
            except Exception:  # a mask that cannot be summed is not counted
                continue
            self.tokens = (self.tokens or 0) + count

    def _cuda_peaks(self) -> tuple[int | None, int | None]:
        torch = sys.modules.get("torch")
        if self.cuda_index is None or torch is None or not torch.cuda.is_initialized():
            return None, None
        try:  # the allocator's counters: no sync, no context on another GPU
            allocated = torch.cuda.max_memory_allocated(self.cuda_index)
            return int(allocated), int(torch.cuda.max_memory_reserved(self.cuda_index))
        except Exception:
            return None, None


def _counts(speed: RankSpeed) -> tuple[Any, ...]:
    return (
        speed.samples,
        speed.batches,
        speed.tokens,
        speed.peak_memory_bytes,
        speed.cuda_max_allocated,
        speed.cuda_max_reserved,
    )


def _read_count(item: Any) -> int:
    if hasattr(item, "item") and hasattr(item, "ready"):  # a DeviceScalar: the sum arrived
        return int(item.item())
    return int(item.sum().item())  # a mask on the CPU, summed here rather than in the loop


def peak_resident_bytes() -> int | None:
    """The most resident memory this process has held, in bytes.

    Example:
        >>> peak_resident_bytes() > 0
        True
    """
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):
        return None
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # Linux says kB


def batch_size(batch: Any) -> int:
    """Samples in ``batch``: the first dimension of its first tensor (its shape, not values).

    Example:
        >>> import torch
        >>> batch_size({"input_ids": torch.zeros(4, 7), "labels": torch.zeros(4)})
        4
        >>> batch_size((torch.zeros(3, 2), torch.zeros(3)))
        3
    """
    if isinstance(batch, (list, tuple)):  # the common cases first: this runs at every batch
        if batch and _holds_tensor(batch[0]):
            return batch_size(batch[0])
        return len(batch)  # a batch of strings or numbers
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if isinstance(batch, Mapping):
        for value in batch.values():
            if _holds_tensor(value):
                return batch_size(value)
    return 0


def _holds_tensor(value: Any) -> bool:
    if hasattr(value, "shape"):
        return True
    if isinstance(value, Mapping):
        return any(_holds_tensor(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return bool(value) and _holds_tensor(value[0])
    return False


def batch_tokens(batch: Any) -> Any:
    """What the tokens of ``batch`` will be counted from, without reading a value now.

    The ``attention_mask`` itself (a CPU tensor, summed later on the metrics thread), its sum
    on its GPU, queued without a sync and copied back asynchronously, or the size of
    ``input_ids`` when there is no mask. None when the batch carries no tokens.

    Example:
        >>> import torch
        >>> batch_tokens({"input_ids": torch.zeros(2, 5, dtype=torch.long)})
        10
    """
    if not isinstance(batch, Mapping):
        return None
    mask = batch.get("attention_mask")
    if mask is not None and hasattr(mask, "sum"):
        if getattr(getattr(mask, "device", None), "type", "cpu") == "cuda":
            from notebook_kit.runtime.metrics import DeviceScalar

            return DeviceScalar(mask.sum())
        return mask
    ids = batch.get("input_ids")
    if ids is not None and hasattr(ids, "numel"):
        return int(ids.numel())
    return None
