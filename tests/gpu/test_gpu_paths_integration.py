"""On a real GPU: what only a GPU can show about logging, streams, NCCL pools and launches.

No sync at all while a logged loop trains; a value logged on a side stream or another GPU
arrives whole; a pool interrupted inside an NCCL loop serves the next cell at once; the GPU
memory of a closed pool is freed; a stopped launch leaves the next one working; with several
GPUs, no rank but 0 opens a context on GPU 0 and a dying rank ends the launch promptly.
Each scenario runs in a fresh interpreter (``run_fresh``), standing for a fresh kernel.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.gpu.conftest import GPUS, run_fresh

COMMON = """
import json, os, signal, threading, time, torch
from torch import nn
import torch.distributed as dist
import notebook_kit
from notebook_kit import Accelerator, WorkerPool, notebook_launcher
"""

needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs two or more GPUs")


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def test_a_logged_training_loop_never_syncs_and_logs_what_item_reads():
    out = run_fresh(
        COMMON
        + """
def train(steps=200):
    accelerator = Accelerator(mixed_precision="bf16")
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(32, 64, device=accelerator.device)
    kept = []
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any sync in the loop raises
    try:
        for step in range(steps):
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.log({"loss": loss, "lr": 1e-3}, step=step)
            notebook_kit.log({"also": loss}, step=step)
            kept.append(loss.detach().clone())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    logged = [record["values"]["loss"] for record in accelerator.logged]
    return {"equal": logged == [value.item() for value in kept], "count": len(logged)}
forked = notebook_launcher(train, isolate=True, live=False)
in_kernel = notebook_launcher(train, num_processes=1, live=False)
sent = notebook_kit.last_run().metrics["loss"]
print(json.dumps({"forked": forked, "in_kernel": in_kernel, "sent": len(sent)}))
"""
    )
    expected = {"equal": True, "count": 200}
    assert _last_json(out) == {"forked": expected, "in_kernel": expected, "sent": 200}


def test_a_value_logged_on_a_side_stream_or_another_gpu_arrives_whole():
    out = run_fresh(
        COMMON
        + """
def train():
    accelerator = Accelerator()
    default, side = torch.cuda.current_stream(), torch.cuda.Stream()
    with torch.cuda.stream(side):
        big = torch.randn(4096, 4096, device="cuda")
    expected = []
    for step in range(20):
        loss = torch.randn(4096, device="cuda").pow(2).mean()  # made on the default stream
        expected.append(loss.clone())
        with torch.cuda.stream(side):
            side.wait_stream(default)
            busy = big @ big  # the side stream is busy: the copy of the logged value waits
            accelerator.log({"loss": loss}, step=step)  # copied on the side stream
        del loss  # its memory goes back to the default stream's pool at once ...
        torch.full((1,), 123.0, device="cuda")  # ... unless the copy was recorded there
    others = torch.cuda.device_count() > 1
    if others:  # a value on GPU 1 while GPU 0 is current
        with torch.cuda.device(1):
            far = torch.randn(1024, 1024, device="cuda:1").pow(2).mean()
        accelerator.log({"far": far}, step=0)
    torch.cuda.synchronize()
    logged = [r["values"]["loss"] for r in accelerator.logged if "loss" in r["values"]]
    ok = logged == [value.item() for value in expected]
    if others:
        ok = ok and accelerator.logged[-1]["values"]["far"] == far.item()
    return ok
print(json.dumps({"whole": notebook_launcher(train, isolate=True, live=False)}))
"""
    )
    assert _last_json(out) == {"whole": True}


def test_a_pool_interrupted_in_an_nccl_loop_serves_the_next_cell_within_five_seconds():
    out = run_fresh(
        COMMON
        + f"""
pool = WorkerPool(num_processes={GPUS}, live=False)
pool.run_cell("import torch, torch.distributed as dist; rank = dist.get_rank()")
assert pool.run_cell("dist.get_backend()") == "nccl"
threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    pool.run_cell("t = torch.ones(1 << 20, device='cuda')\\nwhile True:\\n    dist.all_reduce(t)")
except KeyboardInterrupt:
    pass
started = time.monotonic()
pool.run_cell("import torch, torch.distributed as dist; rank = dist.get_rank()")
value = pool.run_cell("t = torch.ones(1, device='cuda'); dist.all_reduce(t); t.item()")
print(json.dumps({{"value": value, "seconds": time.monotonic() - started}}))
pool.close()
"""
    )
    result = _last_json(out)
    assert result["value"] == float(GPUS) and result["seconds"] < 5, result


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi (NVML)")
def test_closing_a_pool_frees_its_gpu_memory():
    out = run_fresh(
        COMMON
        + """
import subprocess
def used():
    query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    return int(subprocess.run(query, capture_output=True, text=True).stdout.split()[0])
before = used()
pool = WorkerPool(num_processes=1, live=False)
pool.run_cell("import torch; held = torch.empty(4 << 30, dtype=torch.uint8, device='cuda')")
during = used()
pool.close()
deadline = time.monotonic() + 5
after = used()
while after - before > 1000 and time.monotonic() < deadline:
    time.sleep(0.1)
    after = used()
print(json.dumps({"before": before, "during": during, "after": after}))
"""
    )
    mib = _last_json(out)
    assert mib["during"] - mib["before"] >= 4000, mib
    assert mib["after"] - mib["before"] < 1000, mib


def test_a_stopped_or_timed_out_gpu_launch_leaves_the_next_launch_working():
    out = run_fresh(
        COMMON
        + """
def spin():
    t = torch.ones(1 << 20, device="cuda")
    while True:
        t.mul_(1.0001)
def where():
    return str(Accelerator().device)
outcomes = []
try:
    notebook_launcher(spin, isolate=True, timeout=3, live=False)
except Exception as error:
    outcomes.append(type(error).__name__)
threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    notebook_launcher(spin, isolate=True, live=False)
except KeyboardInterrupt:
    outcomes.append("KeyboardInterrupt")
print(json.dumps({"outcomes": outcomes, "next": notebook_launcher(where, isolate=True, live=False),
                  "kernel_cuda": torch.cuda.is_initialized()}))
"""
    )
    result = _last_json(out)
    assert result["outcomes"][1] == "KeyboardInterrupt" and len(result["outcomes"]) == 2
    assert result["next"] == "cuda:0" and result["kernel_cuda"] is False


def test_a_returned_gpu_generator_comes_home_on_the_cpu():
    out = run_fresh(
        COMMON
        + """
def make():
    generator = torch.Generator(device="cuda")
    generator.manual_seed(77)
    return generator
home = notebook_launcher(make, isolate=True, live=False)
print(json.dumps({"device": str(home.device), "seed": home.initial_seed(),
                  "kernel_cuda": torch.cuda.is_initialized()}))
"""
    )
    assert _last_json(out) == {"device": "cpu", "seed": 77, "kernel_cuda": False}


def test_fp16_overflow_with_fused_adamw_on_the_gpu_is_skipped_and_holds_the_scheduler():
    out = run_fresh(
        COMMON
        + """
def steps():
    accelerator = Accelerator(mixed_precision="fp16")
    model = nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    loss = model(torch.randn(4, 8, device=accelerator.device)).float().mean() * float("inf")
    accelerator.backward(loss); optimizer.step(); scheduler.step(); optimizer.zero_grad()
    return {"skipped": accelerator.optimizer_step_was_skipped, "lr": scheduler.get_last_lr()}
print(json.dumps(notebook_launcher(steps, isolate=True, live=False)))
"""
    )
    assert _last_json(out) == {"skipped": True, "lr": [0.1]}


@needs_two_gpus
def test_no_context_on_gpu_zero_from_any_rank_above_zero_and_a_dying_rank_ends_promptly():
    out = run_fresh(
        COMMON
        + f"""
from notebook_kit import WorkerError
def report():
    accelerator = Accelerator()
    for step in range(50):
        loss = torch.randn(8, device=accelerator.device).pow(2).mean()
        accelerator.log({{"loss": loss}}, step=step)
        notebook_kit.should_stop()
    accelerator.wait_for_everyone()
    time.sleep(0.3)  # the sender thread has asked its events by now
    flags = torch.tensor([float(torch._C._cuda_hasPrimaryContext(0))], device=accelerator.device)
    everyone = [torch.zeros_like(flags) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flags)
    return [bool(flag.item()) for flag in everyone]
def die():
    t = torch.ones(1 << 20, device=f"cuda:{{dist.get_rank()}}")
    if dist.get_rank() == 1:
        time.sleep(1.0)
        os._exit(3)
    while True:
        dist.all_reduce(t)
        torch.cuda.synchronize()
contexts = notebook_launcher(report, num_processes={GPUS}, live=False)
started = time.monotonic()
try:
    notebook_launcher(die, num_processes={GPUS}, live=False)
except WorkerError as error:
    named = str(error).splitlines()[0]
print(json.dumps({{"contexts": contexts, "named": named,
                  "seconds": time.monotonic() - started}}))
"""
    )
    result = _last_json(out)
    assert result["contexts"] == [True] + [False] * (GPUS - 1), result
    assert f"Rank 1 of {GPUS}" in result["named"] and result["seconds"] < 15, result
