"""Worker side of the metrics channel, run in every training process: cheap logging, batched.

A worker's ``log`` call only appends to a bounded in-memory buffer; a background thread sends
the buffer to the kernel in batches a few times a second. When the kernel reads too slowly the
buffer fills: the newest record then waits beside it, in place of the one that waited there,
which is dropped and counted. So the records in between are lost under pressure, never the
newest (the final loss arrives exactly), and the count travels with the next batch, so the
kernel can say how many records it never saw. The kernel half is
:class:`notebook_kit.live.metrics.MetricsAggregator`.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from notebook_kit.runtime.context import LaunchContext
from notebook_kit.runtime.messages import MetricsBatch, Progress, plain_values
from notebook_kit.runtime.step_clock import StepClock
from notebook_kit.runtime.throughput import DeviceScalar, SpeedCounter

__all__ = [
    "WorkerChannel",
    "channel",
    "close_channel",
    "count_samples",
    "flush",
    "loader_counter",
    "log_from_worker",
    "log_snapshots",
    "settle",
    "snapshot_values",
    "speed_counter",
    "step_clock",
    "waiting_on_ranks",
]

_BUFFER_RECORDS = 10_000
_SEND_INTERVAL = 0.05  # seconds between batches: bounds the latency a record adds
_EXTENSION = "metrics"  # where a context keeps its channel

Record = tuple[int, int | None, dict[str, Any]]  # rank, step, values


class WorkerChannel:
    """One process's side of the channel: a bounded buffer and the thread that empties it.

    In a forked worker ``send`` writes to a pipe that can block, so a daemon thread does the
    sending. In the kernel's own process (a run with one process) ``send`` is a plain call,
    so records go out at once and nothing needs a thread.

    Example::

        channel(current_launch()).log(step=3, values={"loss": 0.5})
    """

    def __init__(self, context: LaunchContext, capacity: int = _BUFFER_RECORDS) -> None:
        self.context = context
        self.capacity = capacity
        self.buffer: collections.deque[Record] = collections.deque()
        self.newest: Record | None = None  # the newest record, kept while the buffer is full
        self.dropped = 0
        self.steps = 0  # progress count (advanced by ``progress.advance``)
        self.total: int | None = None
        self.epoch_length: int | None = None
        self.progress_source: int | None = None  # id of the loader whose batches count
        self._sent_state: tuple[int, int, int | None, int | None] = (0, 0, None, None)
        self._lock = threading.Lock()  # one batch at a time: the thread or ``flush``
        self._newest_lock = threading.Lock()  # ``newest`` changes hands: never held in a send
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.direct = context.world_size == 1  # a world of one runs inside the kernel
        self.speed = SpeedCounter(context.device, context.local_rank)

    def log(self, step: int | None, values: dict[str, Any]) -> None:
        if self.newest is None and len(self.buffer) < self.capacity:
            self.buffer.append((self.context.rank, step, values))
        else:
            self._keep_newest((self.context.rank, step, values))
        self.state_changed()

    def _keep_newest(self, record: Record) -> None:
        """The buffer is full (or was, and its newest record is not sent yet): ``record``
        waits beside it in place of the one waiting there, which is dropped and counted."""
        with self._newest_lock:
            if self.newest is None and len(self.buffer) < self.capacity:
                self.buffer.append(record)  # the sender took the newest meanwhile: in order
                return
            if self.newest is not None:
                self.dropped += 1
            self.newest = record

    def state_changed(self) -> None:
        """Progress or total changed: send now in-kernel, else with the next batch."""
        if self.direct:
            self.send_batch()
        elif self._thread is None:
            self._start()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="notebook_kit-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed.wait(_SEND_INTERVAL):
            self.send_batch()

    def send_batch(self, wait: bool = False) -> None:
        """Send what is buffered (and the progress state, if it changed).

        Records whose GPU values have not arrived yet stay for the next batch, unless
        ``wait``: then everything goes, waiting for the device if it must.
        """
        send = self.context.send
        with self._lock:
            ready = len(self.buffer)
            if not wait:  # the first record still on its way, and those after it, wait
                ready = next((i for i in range(ready) if not _ready(self.buffer[i][2])), ready)
            records = [self.buffer.popleft() for _ in range(ready)]
            if not self.buffer:
                self._take_newest(records, wait)
            state = (self.dropped, self.steps, self.total, self.epoch_length)
            if send is None:
                return
            now = time.monotonic()
            speed = self.speed.snapshot(wait) if self.speed.may_send(now, wait) else None
            if speed is not None and not self.speed.changed(speed, wait):
                speed = None
            if speed is None and not records and state == self._sent_state:
                return
            batch = MetricsBatch(
                rank=self.context.rank,
                records=tuple((rank, step, settle(values)) for rank, step, values in records),
                dropped=state[0],
                progress=Progress(steps=state[1], total=state[2], epoch_length=state[3]),
                speed=speed,
            )
            send(batch)
            self._sent_state = state
            if speed is not None:
                self.speed.sent, self.speed.sent_at = speed, now

    def _take_newest(self, records: list[Record], wait: bool) -> None:
        """Add the newest record kept beside the buffer, once everything before it is taken
        (and its GPU values have arrived, unless ``wait``)."""
        with self._newest_lock:
            newest = self.newest
            if newest is not None and (wait or _ready(newest[2])):
                records.append(newest)
                self.newest = None

    def counted(self) -> None:
        """Batches or samples are counted: start the sender (the first time only)."""
        if self._thread is None and not self.direct:
            self._start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and send what is left."""
        if self.speed.first is not None and self.speed.ended is None:
            self.speed.ended = time.monotonic()  # the function returned: the counting ends
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.send_batch(wait=True)


def channel(context: LaunchContext) -> WorkerChannel:
    """The channel of ``context``, created on first use (one per launch and process).

    Example::

        channel(current_launch()).dropped
        # 0
    """
    existing = context.extensions.get(_EXTENSION)
    if existing is None:
        existing = context.extensions[_EXTENSION] = WorkerChannel(context)
    return existing


def log_from_worker(
    context: LaunchContext | None, values: Mapping[str, Any], step: int | None = None
) -> None:
    """Queue ``values`` for the kernel without blocking (what ``Accelerator.log`` calls).

    Scalar tensors on the CPU are read at once; scalars on a GPU are copied to host memory
    asynchronously and sent once they arrived, so the training loop never waits for the
    device. Outside a launch this does nothing.

    Args:
        context: The launch of this process (``runtime.current_launch()``).
        values: Metric name to number or scalar tensor.
        step: The training step; None numbers each rank's calls 0, 1, 2, ...

    Example::

        log_from_worker(current_launch(), {"loss": loss}, step=i)
    """
    log_snapshots(context, snapshot_values(values), step)


def log_snapshots(
    context: LaunchContext | None, snapshots: dict[str, Any], step: int | None = None
) -> None:
    """Queue values :func:`snapshot_values` already took (so one log call copies once)."""
    if context is None or context.send is None:
        return
    channel(context).log(step, snapshots)


def loader_counter(context: LaunchContext | None, loader: object) -> SpeedCounter | None:
    """This rank's counter when ``loader``'s batches are the ones counted and timed (asked once
    per pass: the loader then calls it at every batch); None otherwise, or outside a launch.

    Example::

        counter = loader_counter(current_launch(), prepared_loader)
        counter.count_loader_batch(batch)
        counter.clock.handed()
    """
    if context is None or context.send is None:
        return None
    sender = channel(context)
    if not sender.speed.counts(loader):
        return None
    sender.counted()
    return sender.speed


def step_clock(context: LaunchContext | None) -> StepClock | None:
    """This rank's step clock, where a strategy reports its collectives; None outside a launch.

    Example::

        step_clock(current_launch()).time_backward(loss)
    """
    if context is None or context.send is None:
        return None
    return channel(context).speed.clock


@contextlib.contextmanager
def waiting_on_ranks(context: LaunchContext | None) -> Iterator[None]:
    """Time the block as the step's wait on the other ranks: a collective the runtime makes
    for the user (the Stop vote, the Accelerator's object collectives and guarded calls).

    A faster rank sits in such a collective until the slowest arrives; timed as compute, that
    wait would make every rank look as busy as the slowest, and hide the straggler. Costs
    nothing where no step is timed (no channel yet, or outside a launch).

    Example::

        with waiting_on_ranks(current_launch()):
            dist.all_reduce(ballot, group=group)
    """
    sender = context.extensions.get(_EXTENSION) if context is not None else None
    if sender is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        sender.speed.clock.waited(time.perf_counter() - started)


def speed_counter(context: LaunchContext | None) -> SpeedCounter | None:
    """This rank's counter (for the model's FLOPs and the device's peak); None outside a launch.

    Example::

        speed_counter(current_launch()).model
    """
    if context is None or context.send is None:
        return None
    return channel(context).speed


def count_samples(context: LaunchContext | None, samples: int) -> None:
    """Count ``samples`` a hand-written loop trained on (``notebook_kit.log(samples=...)``).

    Example::

        count_samples(current_launch(), len(inputs))
    """
    if context is None or context.send is None:
        return
    sender = channel(context)
    sender.speed.count_samples(samples)
    sender.counted()


def snapshot_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Name to what can be read later without a sync: a float, a tensor copy, a DeviceScalar.

    Example:
        >>> import torch
        >>> snapshot_values({"loss": torch.tensor(0.5)})["loss"].item()
        0.5
    """
    return {name: _snapshot(value) for name, value in values.items()}


def flush(context: LaunchContext | None) -> None:
    """Send everything logged so far, blocking until it is written.

    Example::

        flush(current_launch())
    """
    if context is not None and _EXTENSION in context.extensions:
        channel(context).send_batch(wait=True)


def close_channel(context: LaunchContext | None) -> None:
    """Stop the sender thread and send what is left; call when the user's function ends.

    Example::

        close_channel(current_launch())
    """
    if context is not None and _EXTENSION in context.extensions:
        channel(context).close()


def _snapshot(value: Any) -> Any:
    """What ``value`` is now, readable later without waiting: no ``item()`` on this thread.

    A tensor is copied (later in-place updates must not leak in); one on a GPU is copied to
    host memory asynchronously. Numbers stay as they are.
    """
    if isinstance(value, DeviceScalar):
        return value
    if hasattr(value, "detach") and hasattr(value, "device"):
        if value.device.type == "cuda" and value.numel() == 1:
            return DeviceScalar(value)
        return value.detach().clone()
    return value


def _ready(values: dict[str, Any]) -> bool:
    """True when no value of a record is still on its way from the GPU."""
    return all(value.ready() for value in values.values() if isinstance(value, DeviceScalar))


def settle(values: dict[str, Any]) -> dict[str, float]:
    """The record's numbers, written back in place of their snapshots once they are read.

    An Accelerator's history holds the same dict: its GPU values then free their pinned host
    memory and their event as soon as they are sent, instead of when the history drops them.
    Only values of existing keys change, so a reader iterating the dict meanwhile is safe.
    """
    plain = plain_values(values)
    for name in values:
        if isinstance(name, str) and name in plain:
            values[name] = plain[name]
    return plain
