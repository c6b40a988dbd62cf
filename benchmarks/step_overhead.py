"""Step-time overhead of the Accelerator loop over hand-written torch code.

Both loops train the same model on the same data for the same number of steps, inside the
same launch, alternating in blocks so that background load on a shared machine hits both
alike. Two comparisons:

* 2 processes: hand-written DistributedDataParallel + DistributedSampler vs the Accelerator.
* 1 process: a plain torch loop vs the Accelerator.
* 2 processes: the Accelerator with the speed measurements (samples and tokens counted, each
  step split into data, compute and collective wait, model FLOPs) against the same loop with
  them turned off, in the same launch (target <= 1.01).

Prints the median step time of each and the ratio Accelerator / hand-written (target <= 1.03),
by wall-clock time and by the process's CPU time (steadier when other jobs share the cores).

Usage:
    python benchmarks/step_overhead.py [--steps 150] [--blocks 4]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import notebook_kit.accelerator.accelerator as accelerator_module
import notebook_kit.accelerator.prepared_loader as prepared_loader
from notebook_kit import Accelerator, notebook_launcher, set_seed
from notebook_kit.runtime.throughput import SpeedCounter

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
    as if the speed measurements did not exist."""
    if measured:
        yield
        return
    nothing = lambda *_: None  # noqa: E731
    patches = [
        (prepared_loader, "loader_clock"),
        (prepared_loader, "count_batch"),
        (accelerator_module, "step_clock"),
        (accelerator_module, "speed_counter"),
    ]
    saved = [getattr(module, name) for module, name in patches]
    for module, name in patches:
        setattr(module, name, nothing)
    try:
        yield
    finally:
        for (module, name), value in zip(patches, saved, strict=True):
            setattr(module, name, value)


def _accelerated(steps: int, measured: bool = True) -> list[tuple[float, float]]:
    with _speed_measured(measured):
        return _accelerated_loop(steps)


def _accelerated_loop(steps: int) -> list[tuple[float, float]]:
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


def _added_work(rounds: int = 3000) -> float:
    """Seconds a step spends on the speed measurements themselves: counting a batch, the
    loader's clock and the timed backward, against a plain backward of a tiny graph (the
    difference is too small for step medians to show above their noise)."""
    weight = torch.ones(4, requires_grad=True)
    batch = (torch.zeros(BATCH_SIZE, FEATURES), torch.zeros(BATCH_SIZE))
    counter = SpeedCounter()
    loader = object()
    best = {True: float("inf"), False: float("inf")}
    for _ in range(5):
        for measured in (False, True):
            start = time.perf_counter()
            for _ in range(rounds):
                loss = (weight * 2).sum()
                if measured:
                    counter.loader_clock(loader).asking()  # type: ignore[union-attr]
                    counter.count_batch(batch, loader)
                    counter.clock.handed()
                    counter.clock.time_backward(loss)
                else:
                    loss.backward()
            best[measured] = min(best[measured], (time.perf_counter() - start) / rounds)
    return best[True] - best[False]


def _compare_measured(steps: int, blocks: int) -> dict[str, float]:
    """The Accelerator loop with the speed measurements on and off, and off a second time
    (the noise floor: how far two identical loops land apart), alternating in blocks."""
    runs: dict[str, list[tuple[float, float]]] = {"on": [], "off": [], "off_again": []}
    for block in range(blocks):
        order = list(runs) if block % 2 == 0 else list(runs)[::-1]
        for name in order:
            runs[name].extend(_accelerated(steps, name == "on"))
    result = {"added": _added_work()}
    for name, times in runs.items():
        result[f"{name}_wall"] = statistics.median(wall for wall, _ in times)
        result[f"{name}_cpu"] = statistics.median(cpu for _, cpu in times)
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
        _compare_measured, args=(options.steps, options.blocks), num_processes=2
    )
    print(
        f"2 processes, speed measurements: median step off {result['off_wall'] * 1e3:.3f} ms, "
        f"on {result['on_wall'] * 1e3:.3f} ms; ratio on/off: wall "
        f"{result['on_wall'] / result['off_wall']:.3f}, "
        f"CPU time {result['on_cpu'] / result['off_cpu']:.3f} (target <= 1.01); noise floor "
        f"(off again/off): wall {result['off_again_wall'] / result['off_wall']:.3f}, CPU time "
        f"{result['off_again_cpu'] / result['off_cpu']:.3f}; the measurements' own work "
        f"{result['added'] * 1e6:.1f} us a step, {result['added'] / result['off_wall']:.2%} of "
        "the step"
    )


if __name__ == "__main__":
    main()
