"""FSDP2 through the Accelerator: per-rank memory against DDP, and step time against a
hand-written ``fully_shard`` loop, measured in the same run.

Memory: a stack of square linear layers trained with Adam, built inside each worker. Per rank
it reports the bytes of parameters, gradients and optimizer state that rank holds (counted
from the local shards, exact), and its resident memory after a few steps minus its resident
memory before the model was built (glibc is told to return freed blocks, so the figure is
what the rank really keeps). DDP vs FSDP2 at 2 and 4 ranks; the goal is FSDP2 at 2 ranks
≤ 0.55× DDP.

Step time: in one launch of 2 ranks, the same model trained by the Accelerator with
``fsdp_plugin`` and by a hand-written ``fully_shard`` loop, in interleaved blocks so
background load hits both alike; the goal is ≤ 1.03×.

HSDP (2 × 2) and tensor parallel (TP 2) rows (``benchmarks/_parallel.py``): per-rank memory
against the unsplit model, and step time of ``Accelerator(parallelism_config=...)`` against
the same layout written by hand with ``fully_shard``/``parallelize_module``, in the same run.

A GPU section runs the step-time comparison on ``cuda`` (nccl, a world of one per GPU) when
a GPU is present, and says so when there is none.

Each round times the two loops, and the same hand-written loop built a second time, one
block each, in an order that rotates over the rounds. A loop's block over the hand-written
loop's block of the same round is its paired ratio; the median of those is reported beside the
ratio of the medians: the blocks of a round ran seconds apart, so a machine whose load drifts
over the run moves them alike. The second hand-written loop is the noise floor.

Usage:
    python -m benchmarks.fsdp [--quick] [--blocks N] [--steps N] [--out benchmarks/results]

``--quick`` runs tiny sizes at 2 ranks only, in seconds, so a test can run the whole script;
its figures mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import itertools
import os
import statistics
import time
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch import nn

from benchmarks._parallel import parallel_sections
from benchmarks._report import machine_description
from notebook_kit import Accelerator, FullyShardedDataParallelPlugin, notebook_launcher

_M_MMAP_THRESHOLD = -3


def _return_freed_memory() -> None:
    """Freed tensors go back to the OS at once, so resident memory measures what is kept."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, 64 * 1024)


def _stack(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(depth)])


def _local_bytes(tensors: list[torch.Tensor]) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def _memory_run(kind: str, width: int, depth: int, steps: int) -> dict[str, Any]:
    gc.collect()
    before = psutil.Process().memory_info().rss
    model = _stack(width, depth)
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["Linear"])  # fmt: skip
    accelerator = Accelerator(fsdp_plugin=plugin if kind == "fsdp2" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    inputs = torch.randn(8, width)
    for _ in range(steps):
        accelerator.backward(model(inputs).square().mean())
        optimizer.step()
    params = list(model.parameters())
    states = [v for s in optimizer.optimizer.state.values() for v in s.values() if v.dim() > 0]
    counted = _local_bytes(params) + _local_bytes([p.grad for p in params]) + _local_bytes(states)
    gc.collect()
    kept = psutil.Process().memory_info().rss - before
    row = torch.tensor([float(counted), float(kept)])
    rows = [torch.zeros(2) for _ in range(accelerator.num_processes)]
    dist.all_gather(rows, row)
    return {"bytes": max(r[0].item() for r in rows), "rss": max(r[1].item() for r in rows)}


def _hand_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor) -> None:
    model(inputs).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _hand_loop(width: int, depth: int, device: str, mesh: Any) -> Any:
    from torch.distributed.fsdp import fully_shard

    hand = _stack(width, depth).to(device)
    for layer in hand:
        fully_shard(layer, mesh=mesh)
    fully_shard(hand, mesh=mesh)
    return hand, torch.optim.Adam(hand.parameters(), lr=1e-4)


# The loops of one round, in every order over the rounds, so none is always first or last.
_ORDERS = list(itertools.permutations(("hand", "ours", "again")))


def _timing_run(width: int, depth: int, steps: int, blocks: int, device: str) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    hand, hand_optimizer = _hand_loop(width, depth, device, mesh)
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["Linear"])  # fmt: skip
    accelerator = Accelerator(fsdp_plugin=plugin, cpu=device == "cpu")
    model = _stack(width, depth)
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=1e-4))
    # The same hand-written loop again, built last: how far two identical loops drift apart
    # on this machine in this run, the floor under which a difference means nothing.
    again, again_optimizer = _hand_loop(width, depth, device, mesh)
    inputs = torch.randn(16, width, device=device)

    def ours() -> None:
        accelerator.backward(model(inputs).square().mean())
        optimizer.step()
        optimizer.zero_grad()

    runs = {
        "hand": lambda: _hand_step(hand, hand_optimizer, inputs),
        "ours": ours,
        "again": lambda: _hand_step(again, again_optimizer, inputs),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}  # steadier when cores are shared
    for name in runs:  # warm-up
        runs[name]()
    for block in range(blocks):
        for name in _ORDERS[block % len(_ORDERS)]:
            if device == "cuda":
                torch.cuda.synchronize()
            started, started_cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                runs[name]()
            if device == "cuda":
                torch.cuda.synchronize()
            cpu[name].append((time.process_time() - started_cpu) / steps)
            dist.barrier()
            times[name].append((time.perf_counter() - started) / steps)
    result: dict[str, Any] = {}
    for name in runs:
        for kind, values in (("", times), ("_cpu", cpu)):
            result[f"{name}{kind}"] = statistics.median(values[name])
            pairs = zip(values[name], values["hand"], strict=True)  # a round's blocks, adjacent
            result[f"{name}{kind}_paired"] = statistics.median(a / b for a, b in pairs)
    return result


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB"


def _memory_section(width: int, depth: int, steps: int, ranks_run: tuple[int, ...]) -> list[str]:
    results = {}
    for ranks in ranks_run:
        for kind in ("ddp", "fsdp2"):
            results[kind, ranks] = notebook_launcher(
                _memory_run, args=(kind, width, depth, steps), num_processes=ranks, live=False
            )
    lines = [
        f"### Per-rank memory: {depth} layers of {width}², Adam, {steps} steps (CPU, gloo)",
        "",
        "| setup | parameters + gradients + Adam state (largest rank) | vs DDP, same ranks "
        "| resident memory kept (largest rank) | vs DDP, same ranks |",
        "|---|---|---|---|---|",
    ]
    for ranks in ranks_run:
        ddp = results["ddp", ranks]
        for kind in ("ddp", "fsdp2"):
            row = results[kind, ranks]
            lines.append(
                f"| {kind.upper()}, {ranks} ranks | {_mib(row['bytes'])} | "
                f"{row['bytes'] / ddp['bytes']:.2f}× | {_mib(row['rss'])} | "
                f"{row['rss'] / ddp['rss']:.2f}× |"
            )
    ratio = results["fsdp2", 2]["bytes"] / results["ddp", 2]["bytes"]
    rss_ratio = results["fsdp2", 2]["rss"] / results["ddp", 2]["rss"]
    verdict = "met" if max(ratio, rss_ratio) <= 0.55 else "not met"
    lines += ["", f"Goal FSDP2 ≤ 0.55× DDP at 2 ranks: {ratio:.2f}× bytes, "
              f"{rss_ratio:.2f}× resident — {verdict}.", ""]  # fmt: skip
    return lines


def _timing_section(width: int, depth: int, steps: int, blocks: int, device: str) -> list[str]:
    ranks = 2 if device == "cpu" else max(1, torch.cuda.device_count())
    # The timed loops log nothing for minutes: no stall report in the middle of the table.
    options: dict[str, Any] = {"num_processes": ranks, "live": False, "stall_seconds": None}
    if ranks == 1:
        options["isolate"] = True  # a forked worker with nccl, world of one; kernel stays clean
    times = notebook_launcher(_timing_run, args=(width, depth, steps, blocks, device), **options)
    lines = [
        f"### Step time on {device}: {depth} layers of {width}², batch 16, {ranks} rank(s), "
        f"{blocks} interleaved rounds × {steps} steps",
        "",
        "| loop | median step time | ratio of medians | median paired ratio "
        "| median CPU time per step (rank 0) | ratio of medians | median paired ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {
        "hand": "hand-written `fully_shard`",
        "ours": "Accelerator(fsdp_plugin=...)",
        "again": "hand-written `fully_shard` again (noise floor)",
    }
    for name, label in names.items():
        lines.append(
            f"| {label} | {times[name] * 1e3:.2f} ms | {times[name] / times['hand']:.3f}× "
            f"| {times[name + '_paired']:.3f}× | {times[name + '_cpu'] * 1e3:.2f} ms "
            f"| {times[name + '_cpu'] / times['hand_cpu']:.3f}× "
            f"| {times[name + '_cpu_paired']:.3f}× |"
        )
    verdict = "met" if times["ours_paired"] <= 1.03 else "not met"
    return [
        *lines,
        "",
        f"Goal ≤ 1.03× wall clock (median paired ratio): {verdict}. The second hand-written "
        "loop shows how far two identical loops land apart in the same run.",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 ranks, seconds")
    parser.add_argument("--blocks", type=int, default=None, help="interleaved timing rounds")
    parser.add_argument("--steps", type=int, default=None, help="steps per loop and round")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    _return_freed_memory()
    width, depth = (64, 2) if args.quick else (2048, 8)
    load_before = os.getloadavg()
    lines = [
        "# FSDP2 benchmark",
        "",
        "`python -m benchmarks.fsdp`"
        + (" --quick" if args.quick else "")
        + (f" --blocks {args.blocks}" if args.blocks else "")
        + (f" --steps {args.steps}" if args.steps else ""),
        "",
    ]
    lines += _memory_section(width, depth, steps=2, ranks_run=(2,) if args.quick else (2, 4))
    steps = args.steps or (2 if args.quick else 10)
    blocks = args.blocks or (2 if args.quick else 48)  # many short rounds: load drifts less
    lines += _timing_section(64 if args.quick else 512, 4, steps, blocks, "cpu")
    lines += parallel_sections(64 if args.quick else 512, 2 if args.quick else 4, steps,
                               2 if args.quick else max(blocks // 2, 2))  # fmt: skip
    if torch.cuda.is_available() and not args.quick:
        lines += ["## GPU", "", *_timing_section(4096, 8, steps, blocks, "cuda")]
    else:
        lines += ["## GPU", "", "Not run: no GPU on this machine.", ""]
    lines += [f"Machine: {machine_description(load_before, os.getloadavg())}.", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines)
    (args.out / "fsdp.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
