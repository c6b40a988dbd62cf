"""Worker side of the speed figures: samples, tokens and batches counted, and peak memory.

The training thread only counts and reads the clock: a batch's first dimension (its shape,
never its values), a reference to its ``attention_mask``, an integer add, and the time around
each batch the loader hands out (:class:`~notebook_kit.runtime.step_clock.StepClock`). The
metrics sender thread does the rest when it sends a batch
(:class:`notebook_kit.runtime.metrics.WorkerChannel`): it sums the attention masks (a mask on
a GPU was summed there without a sync and arrives like a logged GPU value, as a
:class:`DeviceScalar`), and reads the peak memory of the process
and of its GPU. The kernel turns what every rank counted into rates
(:mod:`notebook_kit.live.speed`).

Only one loader counts per rank: the first prepared loader iterated (the training loader), so
evaluation passes do not add samples. ``notebook_kit.log(..., samples=n)`` counts instead of
the loader, from its first call on.
"""

from __future__ import annotations

import collections
import contextlib
import resource
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from notebook_kit.runtime.messages import RankSpeed
from notebook_kit.runtime.step_clock import StepClock, watch_gradients

__all__ = [
    "DeviceScalar",
    "ModelFlops",
    "SpeedCounter",
    "batch_size",
    "batch_tokens",
    "model_flops",
    "watch_gradients",
]

_SPEED_INTERVAL = 0.5  # seconds between two speed updates of a rank, when only counts changed


class SpeedCounter:
    """One rank's counts: bumped by the training thread, read by the metrics thread.

    Example::

        counter = SpeedCounter(device="cpu", local_rank=0)
        if counter.counts(loader):  # once per pass: the first loader iterated counts
            counter.count_loader_batch({"input_ids": ids, "attention_mask": mask})
        counter.snapshot().samples
    """

    __slots__ = (
        "batches",
        "clock",
        "cuda_index",
        "ended",
        "explicit",
        "first",
        "flops",
        "flops_per_sample",
        "model",
        "peak_flops",
        "pending",
        "repeats",
        "samples",
        "sent",
        "sent_at",
        "source",
        "tokens",
    )  # read at every batch: fewer lookups, less memory touched

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
        self.clock = StepClock(self.cuda_index)
        self.model: ModelFlops | None = None  # the prepared model's FLOPs, when known
        self.flops_per_sample: float | None = None  # given by the user: replaces ``model``
        self.flops = 0.0  # model FLOPs of the counted batches (with ``model``)
        self.peak_flops: float | None = None  # this rank's device peak (a known GPU)
        self.repeats = False  # another rank of its tp/cp group counts the batches it reads

    def counts(self, loader: object) -> bool:
        """Whether ``loader``'s batches are the ones counted and timed (the first loader
        iterated, unless ``log(samples=...)`` counts instead)."""
        if self.explicit:
            return False
        if self.source is None:
            self.source = id(loader)
        return self.source == id(loader)

    def count_loader_batch(self, batch: Any) -> None:
        """Count a batch of the loader that :meth:`counts` (training thread: shapes only)."""
        if self.explicit:  # log(samples=...) took over in the middle of the pass
            return
        if self.repeats:
            self._count(0, None)  # a step all the same, but its samples are another rank's
            return
        samples = batch_size(batch)
        if self.model is not None and self.flops_per_sample is None:
            self.flops += self.model.batch_flops(batch, samples)
        self._count(samples, batch_tokens(batch))

    def count_samples(self, samples: int) -> None:
        """Count ``samples`` given to ``log``; from the first call on, the loader's counts stop."""
        if not self.explicit:
            self.explicit = True
            self.samples = self.batches = 0
            self.first, self.tokens, self.flops = None, None, 0.0
            self.pending.clear()
        self._count(samples, None)
        self.clock.step_ended()  # a hand-written loop: each log(samples=...) ends a step

    def _count(self, samples: int, tokens: Any) -> None:
        if self.first is None:
            self.first = time.monotonic()
        self.samples += samples
        self.batches += 1
        if self.flops_per_sample is not None:  # (0 samples on a rank that repeats a batch)
            self.flops += samples * self.flops_per_sample
        if tokens is not None:
            self.pending.append(tokens)

    def snapshot(self, wait: bool = False) -> RankSpeed:
        """The counts so far and the memory peaks (metrics thread); GPU token counts not yet
        arrived are left for the next snapshot unless ``wait``."""
        self._read_tokens(wait)
        now = self.ended if self.ended is not None else time.monotonic()
        allocated, reserved = self._cuda_peaks()
        clock = self.clock
        clock.settle(wait)
        return RankSpeed(
            samples=self.samples,
            batches=self.batches,
            tokens=self.tokens,
            seconds=0.0 if self.first is None else max(now - self.first, 0.0),
            peak_memory_bytes=peak_resident_bytes(),
            cuda_max_allocated=allocated,
            cuda_max_reserved=reserved,
            timed_steps=clock.steps,
            step_seconds=clock.step_seconds,
            data_seconds=clock.data_seconds if clock.sees_data else None,
            wait_seconds=clock.wait_seconds if clock.sees_wait else None,
            flops=self.flops if self.model or self.flops_per_sample is not None else None,
            peak_flops=self.peak_flops,
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


@dataclass(frozen=True)
class ModelFlops:
    """A transformer's training FLOPs per token, as TorchTitan and nanoGPT count them.

    ``6 * params + 12 * layers * width * sequence``: a forward and backward pass cost six FLOPs
    per weight a token meets (two forward, four backward), and attention adds
    ``12 * layers * width * sequence`` (scores and their weighted sum, forward and backward).
    ``params`` counts the weights that multiply: every parameter but the lookup tables of
    embeddings (a table tied to the output layer is counted, since that layer multiplies).

    Example:
        >>> ModelFlops(params=1000, layers=2, width=16).per_token(sequence=8)
        9072
    """

    params: int
    layers: int
    width: int

    def per_token(self, sequence: int) -> int:
        return 6 * self.params + 12 * self.layers * self.width * sequence

    def batch_flops(self, batch: Any, samples: int) -> float:
        """The FLOPs of training on ``batch`` (shapes only): every position of ``input_ids``,
        padding included, since the model computes on it."""
        ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
        shape = getattr(ids, "shape", None)
        if shape is None or len(shape) < 2:
            return 0.0
        sequence = int(shape[1])
        return float(samples * sequence * self.per_token(sequence))


def model_flops(model: Any) -> ModelFlops | None:
    """The FLOPs of a transformers model, from its config; None for any other model.

    Example::

        model_flops(GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64))).per_token(128)
    """
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    width = getattr(config, "hidden_size", None)
    if not isinstance(layers, int) or not isinstance(width, int) or not hasattr(model, "modules"):
        return None
    import torch

    multiplied = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    lookups = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, torch.nn.Embedding) and id(m.weight) not in multiplied
    }
    seen: set[int] = set()
    params = 0
    for parameter in model.parameters():
        if id(parameter) not in seen and id(parameter) not in lookups:
            params += parameter.numel()
        seen.add(id(parameter))
    return ModelFlops(params=params, layers=layers, width=width)


def _counts(speed: RankSpeed) -> tuple[Any, ...]:
    return (
        speed.samples,
        speed.batches,
        speed.tokens,
        speed.peak_memory_bytes,
        speed.cuda_max_allocated,
        speed.cuda_max_reserved,
        speed.timed_steps,
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
    if isinstance(batch, (tuple, list)) or not isinstance(batch, Mapping):  # tuples: no ABC
        return None
    mask = batch.get("attention_mask")
    if mask is not None and hasattr(mask, "sum"):
        if getattr(getattr(mask, "device", None), "type", "cpu") == "cuda":
            return DeviceScalar(mask.sum())
        return mask
    ids = batch.get("input_ids")
    if ids is not None and hasattr(ids, "numel"):
        return int(ids.numel())
    return None


class DeviceScalar:
    """A scalar logged on a GPU: copied to host memory in the background, read when it arrived.

    The copy is queued on the current stream of the tensor's own GPU, behind the work that
    computes the value, and an event recorded on that same stream marks its arrival (an event
    on another GPU's stream could say "arrived" before the copy ran). ``record_stream`` keeps
    the caching allocator from handing the source's memory to other work before the copy read
    it. The sender thread asks the event with the GPU made current first: a new thread's
    current device is 0, and asking from there would open a context on GPU 0 in every rank.
    Neither logging nor sending ever waits for the GPU; only :meth:`item` on a value not yet
    arrived does (at the end of a run).
    """

    __slots__ = ("arrived", "device", "host")

    def __init__(self, tensor: Any) -> None:
        import torch

        source = tensor.detach()
        self.device = source.device
        with torch.cuda.device(self.device):
            stream = torch.cuda.current_stream(self.device)
            self.host = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
            self.host.copy_(source, non_blocking=True)
            source.record_stream(stream)
            self.arrived = torch.cuda.Event()
            self.arrived.record(stream)

    def _on_device(self) -> Any:
        import torch

        device = getattr(self, "device", None)
        return contextlib.nullcontext() if device is None else torch.cuda.device(device)

    def ready(self) -> bool:
        with self._on_device():
            return bool(self.arrived.query())

    def item(self) -> Any:
        with self._on_device():
            if not self.arrived.query():  # only a value still on its way is waited for
                self.arrived.synchronize()
        return self.host.item()
