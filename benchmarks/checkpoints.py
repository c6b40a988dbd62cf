"""Checkpoint cost: a blocking ``save_state``, an asynchronous one, and ``load_state``.

Run from the repository root::

    .venv/bin/python -m benchmarks.checkpoints [--layers 13] [--repeats 3]

One process saves a stack of ``Linear(2048, 2048)`` layers (16 MiB each, 13 by default: 208 MiB
of weights) trained one step with Adam, so a checkpoint holds three times that (weights and
Adam's two moments). Each section saves to a local folder and to a loopback S3 server (moto's,
started as the tests start it), ``--repeats`` times, and reports medians:

- blocking save: how long ``save_state`` takes;
- async save: how long ``save_state(async_save=True)`` keeps training waiting (the stall: the
  copy to host memory and the checks before it) and how long until the write is committed;
  the first asynchronous save allocates the host buffers and is reported apart;
- load: how long ``load_state`` takes.

The stall over the blocking save of the same run is the figure to read (goal ≤ 10%). A last
section times training steps while a background write runs against steps without one. The
last one (:mod:`benchmarks.node_loss`) times a cluster run that loses a node, from the loss to
the first step of its restarted attempt, against its fresh start. The results go to
``benchmarks/results/checkpoints.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks._report import machine_description
from notebook_kit import Accelerator

MIB = 1 << 20
WIDTH = 2048


def _trained(layers: int) -> tuple[Accelerator, nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)])
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=1e-4))
    _step(accelerator, model, optimizer)
    return accelerator, model, optimizer


def _step(accelerator: Accelerator, model: nn.Module, optimizer: Any) -> None:
    accelerator.backward(model(torch.randn(8, WIDTH)).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


def _timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _checkpoint_bytes(model: nn.Module) -> int:
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters())


def save_and_load(
    accelerator: Accelerator, where: str, repeats: int, options: dict[str, Any] | None
) -> dict[str, Any]:
    """Blocking saves, async saves (stall and time to commit) and loads into ``where``."""
    saves = accelerator._background_saves

    def save(asynchronous: bool) -> Callable[[], Any]:
        return lambda: accelerator.save_state(
            where, storage_options=options, async_save=asynchronous
        )

    blocking = [_timed(save(False)) for _ in range(repeats)]
    first_stall = _timed(save(True))
    first_done = first_stall + _timed(saves.wait)
    stalls, done = [], []
    for _ in range(repeats):
        stalls.append(_timed(save(True)))
        done.append(stalls[-1] + _timed(saves.wait))
    loads = [_timed(lambda: accelerator.load_state(where, storage_options=options))]
    loads += [_timed(lambda: accelerator.load_state(where, storage_options=options))]
    return {
        "blocking": statistics.median(blocking),
        "stall": statistics.median(stalls),
        "done": statistics.median(done),
        "first_stall": first_stall,
        "first_done": first_done,
        "load": statistics.median(loads),
    }


def steps_during_a_write(
    accelerator: Accelerator, model: nn.Module, optimizer: Any, where: str, steps: int
) -> dict[str, float]:
    """Median step time without a background write, and while one runs."""
    quiet = [_timed(lambda: _step(accelerator, model, optimizer)) for _ in range(steps)]
    busy = []
    saves = accelerator._background_saves
    for _ in range(3):
        accelerator.save_state(where, async_save=True)
        while saves._thread is not None and saves._thread.is_alive():
            busy.append(_timed(lambda: _step(accelerator, model, optimizer)))
        saves.wait()
    return {
        "quiet": statistics.median(quiet),
        "busy": statistics.median(busy) if busy else float("nan"),
        "busy_steps": len(busy),
    }


@contextlib.contextmanager
def _s3_folder() -> Iterator[tuple[str, dict[str, Any]] | None]:
    try:
        from tests.s3_server import s3_server
    except ImportError:
        yield None
        return
    try:
        import moto  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError:
        yield None
        return
    with s3_server() as s3:
        bucket = s3.make_bucket(f"bench-{uuid.uuid4().hex[:8]}")
        yield f"s3://{bucket}/ckpt", s3.options


def _row(name: str, figures: dict[str, Any]) -> str:
    ratio = figures["stall"] / figures["blocking"]
    return (
        f"| {name} | {figures['blocking']:.2f} s | {figures['stall'] * 1e3:.0f} ms "
        f"| {figures['done']:.2f} s | {figures['first_stall'] * 1e3:.0f} ms "
        f"| {figures['load']:.2f} s | {ratio:.1%} |"
    )


def report(
    sizes: str, rows: list[str], ratios: list[float], steps: dict[str, float], machine: str
) -> str:
    met = "met" if ratios and max(ratios) <= 0.10 else "not met"
    lines = [
        "# Checkpoint saves: blocking, asynchronous, and loading",
        "",
        "`python -m benchmarks.checkpoints`",
        "",
        f"One process; {sizes}. Medians of the repetitions; the stall is how long "
        "`save_state(async_save=True)` keeps the training loop waiting, *done* is until the "
        "write is committed (the stall included).",
        "",
        "| storage | blocking save | async stall | async done | first async stall "
        "(buffers allocated) | load | stall / blocking save |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Goal: stall ≤ 10% of a blocking save — {met} (largest ratio {max(ratios):.1%}).",
        "",
        "## Training steps during a background write (local folder)",
        "",
        "| | median step time | × without a write |",
        "|---|---:|---:|",
        f"| no write | {steps['quiet'] * 1e3:.0f} ms | 1.00× |",
        f"| during an async write ({steps['busy_steps']} steps) | {steps['busy'] * 1e3:.0f} ms "
        f"| {steps['busy'] / steps['quiet']:.2f}× |",
        "",
        "The write runs on a thread of the training process: on a machine with few cores its "
        "serialisation and I/O compete with the step for CPU time, which is what the second "
        "row shows; the stall above is what the loop waits for outright.",
        "",
        f"Machine: {machine}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.checkpoints", description=__doc__)
    parser.add_argument("--layers", type=int, default=13, help="Linear(2048, 2048) layers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--node-loss-rounds", type=int, default=3, help="0: leave it out")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    accelerator, model, optimizer = _trained(args.layers)
    total = _checkpoint_bytes(model)
    sizes = (
        f"{args.layers} layers of {WIDTH}² float32: {total // 3 / MIB:.0f} MiB of weights, "
        f"{total / MIB:.0f} MiB per checkpoint with Adam's moments; {args.repeats} repetitions"
    )
    rows, ratios = [], []
    scratch = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    try:
        local = save_and_load(accelerator, str(scratch / "ckpt"), args.repeats, None)
        rows.append(_row("local folder", local))
        ratios.append(local["stall"] / local["blocking"])
        steps = steps_during_a_write(accelerator, model, optimizer, str(scratch / "ckpt"), 10)
        with _s3_folder() as s3:
            if s3 is None:
                rows.append("| S3 (moto, loopback) | not run: needs s3fs and moto | | | | | |")
            else:
                remote = save_and_load(accelerator, s3[0], args.repeats, s3[1])
                rows.append(_row("S3 (moto, loopback)", remote))
                ratios.append(remote["stall"] / remote["blocking"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = report(sizes, rows, ratios, steps, machine_description(load_before, os.getloadavg()))
    if args.node_loss_rounds:
        from benchmarks import node_loss

        text += "\n" + node_loss.section(node_loss.measure(args.node_loss_rounds))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "checkpoints.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
