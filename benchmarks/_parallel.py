"""HSDP and tensor-parallel rows of ``python -m benchmarks.fsdp``.

Each layout runs in one launch on the CPU (gloo): the Accelerator with a ``ParallelismConfig``
and the same layout written by hand (``fully_shard`` on a 2-D mesh for HSDP 2 × 2,
``parallelize_module`` for TP 2), built twice, timed in interleaved rounds as the FSDP2 rows
are. Memory per rank is counted from the local shards (parameters, gradients, Adam state) and
compared with the unsplit model's, with the resident memory the Accelerator's model keeps.
"""

from __future__ import annotations

import gc
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch import nn

from notebook_kit import (
    Accelerator,
    FullyShardedDataParallelPlugin,
    ParallelismConfig,
    notebook_launcher,
)

__all__ = ["parallel_sections"]

_ORDERS = list(itertools.permutations(("hand", "ours", "again")))


def _local_bytes(tensors: list[Any]) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def _stack(width: int, depth: int) -> nn.Module:
    """Pairs of layers widening to 2 × ``width`` and back: column- then row-split under TP."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, 2 * width, bias=False), nn.Linear(2 * width, width, bias=False)]
    return nn.Sequential(*layers)


def _plan(depth: int) -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    for index in range(depth):
        plan[str(2 * index)] = ColwiseParallel()
        plan[str(2 * index + 1)] = RowwiseParallel()
    return plan


def _hand(layout: str, width: int, depth: int) -> tuple[nn.Module, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    model = _stack(width, depth)
    if layout == "hsdp":
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        parallelize_module(model, mesh, _plan(depth))
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def _ours(layout: str, width: int, depth: int) -> tuple[Accelerator, nn.Module, Any]:
    if layout == "hsdp":
        config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
        plugin = FullyShardedDataParallelPlugin(
            auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Linear"]
        )
    else:
        config, plugin = ParallelismConfig(tp_size=2, tp_plan=_plan(depth)), None
    accelerator = Accelerator(parallelism_config=config, fsdp_plugin=plugin, cpu=True)
    model = _stack(width, depth)
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=1e-4))
    return accelerator, model, optimizer


def _time(runs: dict[str, Callable[[], None]], steps: int, blocks: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for name in runs:  # warm-up
        runs[name]()
    for block in range(blocks):
        for name in _ORDERS[block % len(_ORDERS)]:
            started = time.perf_counter()
            for _ in range(steps):
                runs[name]()
            dist.barrier()
            times[name].append((time.perf_counter() - started) / steps)
    result = {}
    for name in runs:
        result[name] = statistics.median(times[name])
        pairs = zip(times[name], times["hand"], strict=True)
        result[f"{name}_paired"] = statistics.median(a / b for a, b in pairs)
    return result


def _run(layout: str, width: int, depth: int, steps: int, blocks: int) -> dict[str, Any]:
    gc.collect()
    before = psutil.Process().memory_info().rss
    accelerator, model, optimizer = _ours(layout, width, depth)
    # The data-parallel ranks read different rows; a TP group reads the same ones.
    inputs = torch.randn(16, width, generator=torch.Generator().manual_seed(dist.get_rank()))
    if layout == "tp":
        inputs = torch.randn(16, width, generator=torch.Generator().manual_seed(0))

    def ours() -> None:
        accelerator.backward(model(inputs).square().mean())
        optimizer.step()
        optimizer.zero_grad()

    ours()  # Adam's state exists from the first step on
    params = list(model.parameters())
    states = [v for s in optimizer.optimizer.state.values() for v in s.values() if v.dim() > 0]
    accelerator.backward(model(inputs).square().mean())  # gradients held for the count
    counted = _local_bytes(params) + _local_bytes([p.grad for p in params]) + _local_bytes(states)
    optimizer.zero_grad()
    gc.collect()
    kept = psutil.Process().memory_info().rss - before
    hand, hand_optimizer = _hand(layout, width, depth)
    again, again_optimizer = _hand(layout, width, depth)

    def step(model: nn.Module, optimizer: Any) -> Callable[[], None]:
        def run() -> None:
            model(inputs).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()

        return run

    runs = {"hand": step(hand, hand_optimizer), "ours": ours, "again": step(again, again_optimizer)}
    result: dict[str, Any] = _time(runs, steps, blocks)
    full = sum(p.numel() * p.element_size() for p in _stack(width, depth).parameters()) * 4
    row = torch.tensor([float(counted), float(kept)])
    rows = [torch.zeros(2) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, row)
    result.update(
        bytes=max(r[0].item() for r in rows), rss=max(r[1].item() for r in rows), full=full
    )
    return result


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB"


def parallel_sections(width: int, depth: int, steps: int, blocks: int) -> list[str]:
    """The HSDP 2 × 2 and TP 2 rows: memory per rank, and step time against the same layout
    by hand, each layout in one launch."""
    labels = {
        "hsdp": ("HSDP 2 × 2 (4 ranks)", "hand-written `fully_shard` on a 2-D mesh", 4),
        "tp": ("TP 2 (2 ranks)", "hand-written `parallelize_module`", 2),
    }
    lines = [
        f"### HSDP and tensor parallel on CPU (gloo): {depth} pairs of {width}→{2 * width}→"
        f"{width} layers, Adam, batch 16, {blocks} interleaved rounds × {steps} steps",
        "",
        "| layout | params + grads + Adam (largest rank) | vs unsplit | resident kept "
        "| hand-written step | Accelerator step | paired ratio | noise floor (hand again) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for layout, (name, hand, ranks) in labels.items():
        got = notebook_launcher(
            _run,
            args=(layout, width, depth, steps, blocks),
            num_processes=ranks,
            live=False,
            stall_seconds=None,
        )
        lines.append(
            f"| {name} | {_mib(got['bytes'])} | {got['bytes'] / got['full']:.2f}× "
            f"| {_mib(got['rss'])} | {got['hand'] * 1e3:.2f} ms ({hand}) "
            f"| {got['ours'] * 1e3:.2f} ms | {got['ours_paired']:.3f}× "
            f"| {got['again_paired']:.3f}× |"
        )
        verdicts.append(f"{name} {got['ours_paired']:.3f}× ({_met(got['ours_paired'])})")
    lines += ["", f"Goal ≤ 1.03× wall clock (median paired ratio): {'; '.join(verdicts)}.", ""]
    return lines


def _met(ratio: float) -> str:
    return "met" if ratio <= 1.03 else "not met"
