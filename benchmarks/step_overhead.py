"""Step-time overhead of the Accelerator loop over hand-written torch code, and of the speed
measurements over the same loop without them.

Three comparisons, each inside one launch:

* 2 processes: hand-written DistributedDataParallel + DistributedSampler vs the Accelerator,
  alternating in blocks of steps so that background load hits both alike.
* 1 process: a plain torch loop vs the Accelerator, the same way.
* 2 processes: the Accelerator with the speed measurements (samples and tokens counted, each
  step split into data, compute and collective wait, model FLOPs) against the same loop with
  them off, and off a second time (the noise floor), three loops stepping in turn (target
  <= 1.01). Beside it: the measurements' own work timed directly, and the metrics sender
  thread's CPU per step in a launch with them on and one with them off.

Prints the median step time of each and the ratio Accelerator / hand-written (target <= 1.03),
by wall-clock time and by the process's CPU time (steadier when other jobs share the cores).

Usage:
    python benchmarks/step_overhead.py [--steps 150] [--blocks 4]

(the speed comparison takes steps x blocks steps of each loop)
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import notebook_kit.accelerator.accelerator as accelerator_module
import notebook_kit.accelerator.distributed_methods as distributed_methods
import notebook_kit.accelerator.prepared_loader as prepared_loader
from notebook_kit import Accelerator, notebook_launcher, set_seed
from notebook_kit.runtime.throughput import SpeedCounter, watch_gradients

BATCH_SIZE = 64
FEATURES, HIDDEN, CLASSES = 128, 512, 10


def _dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8192, FEATURES, generator=generator)
    return TensorDataset(x, torch.randint(0, CLASSES, (8192,), generator=generator))


def _model() -> nn.Module:
    set_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )  # fmt: skip


def _batches(loader: DataLoader | object, set_epoch: Callable[[int], None] | None) -> Iterator:
    epoch = 0
    while True:
        if set_epoch is not None:
            set_epoch(epoch)
        yield from loader  # type: ignore[misc]
        epoch += 1


def _timed(
    step: Callable[[tuple], None], batches: Iterator, steps: int
) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each step; CPU time of the process is steadier on a busy host."""
    times = []
    for _ in range(steps):
        wall, cpu = time.perf_counter(), time.process_time()
        step(next(batches))
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return times[5:]  # the first steps build DDP buckets and warm caches


def _hand_written(steps: int) -> list[tuple[float, float]]:
    model, data = _model(), _dataset()
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    sampler = DistributedSampler(data, shuffle=True, seed=0) if distributed else None
    loader = DataLoader(data, batch_size=BATCH_SIZE, shuffle=sampler is None, sampler=sampler)
    network = DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.SGD(network.parameters(), lr=0.01)

    def step(batch: tuple) -> None:
        inputs, targets = batch
        loss = nn.functional.cross_entropy(network(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return _timed(step, _batches(loader, sampler.set_epoch if sampler else None), steps)


@contextlib.contextmanager
def _speed_measured(measured: bool) -> Iterator[None]:
    """With ``measured`` False, the loader and the Accelerator see no step clock or counter,
    and a prepared model gets no gradient hook, as if the speed measurements did not exist."""
    if measured:
        yield
        return
    nothing = lambda *_: None  # noqa: E731
    patches = [
        (prepared_loader, "loader_counter"),
        (distributed_methods, "step_clock"),
        (accelerator_module, "speed_counter"),
        (accelerator_module, "watch_gradients"),
    ]
    saved = [getattr(module, name) for module, name in patches]
    for module, name in patches:
        setattr(module, name, nothing)
    try:
        yield
    finally:
        for (module, name), value in zip(patches, saved, strict=True):
            setattr(module, name, value)


def _accelerated(steps: int) -> list[tuple[float, float]]:
    accelerator = Accelerator()
    loader = DataLoader(_dataset(), batch_size=BATCH_SIZE, shuffle=True)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def step(batch: tuple) -> None:
        inputs, targets = batch
        loss = nn.functional.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    return _timed(step, _batches(loader, None), steps)


def _compare(steps: int, blocks: int) -> dict[str, float]:
    raw: list[tuple[float, float]] = []
    accelerated: list[tuple[float, float]] = []
    for block in range(blocks):
        # Alternate which loop goes first, so warm-up and load drift do not favour either.
        order = (_hand_written, _accelerated) if block % 2 == 0 else (_accelerated, _hand_written)
        for loop in order:
            (raw if loop is _hand_written else accelerated).extend(loop(steps))
    return {
        "raw_wall": statistics.median(wall for wall, _ in raw),
        "raw_cpu": statistics.median(cpu for _, cpu in raw),
        "accelerator_wall": statistics.median(wall for wall, _ in accelerated),
        "accelerator_cpu": statistics.median(cpu for _, cpu in accelerated),
    }


def _added_work(rounds: int = 2000) -> float:
    """Seconds a step spends on the speed measurements themselves, timed directly: counting
    a batch, the loader's clock and the timed backward of this benchmark's model, against its
    plain backward, one of each in turn (the median difference; a collective-free copy of the
    model, so the other rank's pace is not in it)."""
    model, (inputs, targets) = _model(), next(iter(DataLoader(_dataset(), BATCH_SIZE)))
    watch_gradients(model)
    counter, loader = SpeedCounter(), object()
    clock = counter.clock
    assert counter.counts(loader)
    times: dict[bool, list[float]] = {True: [], False: []}
    for index in range(rounds):
        for measured in (index % 2 == 0, index % 2 == 1):
            loss = nn.functional.cross_entropy(model(inputs), targets)
            start = time.perf_counter()
            if measured:
                clock.asking()
                counter.count_loader_batch((inputs, targets))
                clock.handed()
                clock.time_backward(loss)
            else:
                loss.backward()
            times[measured].append(time.perf_counter() - start)
            model.zero_grad()
    return statistics.median(times[True]) - statistics.median(times[False])


class _Arm:
    """One prepared Accelerator loop of its own (model, optimizer, loader), stepped one batch
    at a time, with the speed measurements on or off for every call it makes."""

    def __init__(self, measured: bool) -> None:
        self.measured = measured
        with _speed_measured(measured):
            accelerator = Accelerator()
            loader = DataLoader(_dataset(), batch_size=BATCH_SIZE, shuffle=True)
            model = _model()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            self.accelerator = accelerator
            self.model, self.optimizer, loader = accelerator.prepare(model, optimizer, loader)
        self.batches = _batches(loader, None)

    def step(self) -> tuple[float, float]:
        """One step's (wall, CPU) seconds; switching the measurements is outside the time."""
        with _speed_measured(self.measured):
            wall, cpu = time.perf_counter(), time.process_time()
            inputs, targets = next(self.batches)
            loss = nn.functional.cross_entropy(self.model(inputs), targets)
            self.accelerator.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
            return time.perf_counter() - wall, time.process_time() - cpu


def _sender_seconds() -> float:
    """CPU seconds the metrics sender thread of this process has used (0 if it never ran)."""
    for thread in threading.enumerate():
        if thread.name == "notebook_kit-metrics" and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


def _sender_per_step(measured: bool, steps: int) -> float:
    """CPU seconds a step costs the metrics sender thread (progress, and with ``measured`` the
    speed snapshots), in a launch of its own: one loop, measured or not."""
    arm = _Arm(measured)
    for _ in range(steps):
        arm.step()
    return _sender_seconds() / steps


def _compare_measured(steps: int) -> dict[str, float]:
    """The Accelerator loop with the speed measurements on and off, and off a second time
    (the noise floor: how far two identical loops land apart), stepped in turn.

    Three loops of their own take one step each in a rotating order, so drift in the
    machine's load and the position in the round hit all three alike (blocks of steps, one
    loop after another, left 2-5% between two identical loops on a shared 2-core machine).
    The loop measured on is the first to iterate its loader, which makes it the one whose
    batches count. The metrics sender thread serves all three alike, so its cost is measured
    apart (:func:`_sender_per_step`)."""
    arms = {"on": _Arm(True), "off": _Arm(False), "off_again": _Arm(False)}
    names = list(arms)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for index in range(steps + 5):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            timed = arms[name].step()
            if index >= 5:  # the first steps build DDP buckets and warm caches
                times[name].append(timed)
    result = {"added": _added_work()}
    for name, samples in times.items():
        result[f"{name}_wall"] = statistics.median(wall for wall, _ in samples)
        result[f"{name}_cpu"] = statistics.median(cpu for _, cpu in samples)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="steps per block")
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks per loop")
    options = parser.parse_args()
    for processes, label in ((2, "2 processes, DDP"), (1, "1 process, plain loop")):
        result = notebook_launcher(
            _compare, args=(options.steps, options.blocks), num_processes=processes
        )
        wall = result["accelerator_wall"] / result["raw_wall"]
        cpu = result["accelerator_cpu"] / result["raw_cpu"]
        print(
            f"{label}: median step hand-written {result['raw_wall'] * 1e3:.3f} ms, "
            f"Accelerator {result['accelerator_wall'] * 1e3:.3f} ms; "
            f"ratio Accelerator/hand-written: wall {wall:.3f}, CPU time {cpu:.3f}"
        )
    result = notebook_launcher(
        _compare_measured, args=(options.steps * options.blocks,), num_processes=2
    )
    sender = {
        measured: notebook_launcher(
            _sender_per_step, args=(measured, options.steps * options.blocks), num_processes=2
        )
        for measured in (True, False)
    }
    print(
        f"2 processes, speed measurements: median step off {result['off_wall'] * 1e3:.3f} ms, "
        f"on {result['on_wall'] * 1e3:.3f} ms; ratio on/off: wall "
        f"{result['on_wall'] / result['off_wall']:.3f}, "
        f"CPU time {result['on_cpu'] / result['off_cpu']:.3f} (target <= 1.01); noise floor "
        f"(off again/off): wall {result['off_again_wall'] / result['off_wall']:.3f}, CPU time "
        f"{result['off_again_cpu'] / result['off_cpu']:.3f}; their own work in the training "
        f"thread {result['added'] * 1e6:.1f} us a step "
        f"({result['added'] / result['off_wall']:.2%}); the metrics sender thread's CPU a step "
        f"{sender[True] * 1e6:.1f} us on, {sender[False] * 1e6:.1f} us off"
    )


if __name__ == "__main__":
    main()
