"""On a real GPU: where runs go, CUDA hazards refused, mixed precision, identity, weights home.

Every scenario runs in a fresh interpreter (``run_fresh``), standing for a fresh kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.gpu.conftest import GPUS, run_fresh

COMMON = """
import json, torch
from torch import nn
import notebook_kit
from notebook_kit import Accelerator, ForkSafetyError, notebook_launcher

def where(*_):
    accelerator = Accelerator()
    return {"device": str(accelerator.device), "backend": torch.distributed.get_backend()}
"""


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def test_one_process_trains_on_the_gpu_in_the_kernel_and_says_so():
    out = run_fresh(
        COMMON
        + """
result = notebook_launcher(where, live=False)
print(json.dumps({**result, "kernel_cuda": torch.cuda.is_initialized()}))
"""
    )
    assert _last_json(out) == {"device": "cuda:0", "backend": "gloo", "kernel_cuda": True}


def test_the_banner_names_the_gpu():
    out = run_fresh(
        COMMON
        + """
from notebook_kit.launch.plan import make_plan
from notebook_kit import LaunchConfig
print(json.dumps({"banner": make_plan(LaunchConfig()).banner()}))
"""
    )
    name = _last_json(out)["banner"]
    assert name.startswith("Running 1 process in this kernel on cuda:0 (") and name.endswith(")")


def test_isolate_trains_in_a_forked_worker_with_nccl_and_the_kernel_stays_cuda_free():
    out = run_fresh(
        COMMON
        + """
first = notebook_launcher(where, isolate=True, live=False)
second = notebook_launcher(where, isolate=True, live=False)
print(json.dumps({"first": first, "second": second,
                  "kernel_cuda": torch.cuda.is_initialized()}))
"""
    )
    expected = {"device": "cuda:0", "backend": "nccl"}
    assert _last_json(out) == {"first": expected, "second": expected, "kernel_cuda": False}


def test_cuda_results_and_weights_come_home_on_the_cpu_and_the_next_fork_works():
    out = run_fresh(
        COMMON
        + """
model = nn.Linear(4, 2)
def train(model):
    accelerator = Accelerator()
    model = accelerator.prepare(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = model(torch.ones(3, 4, device=accelerator.device)).pow(2).sum()
    accelerator.backward(loss); optimizer.step()
    return {"weight": model.weight.detach().clone(), "nested": [torch.ones(2, device="cuda")]}
result = notebook_launcher(train, args=(model,), isolate=True, live=False)
again = notebook_launcher(where, isolate=True, live=False)
print(json.dumps({
    "weight_device": str(result["weight"].device),
    "nested_device": str(result["nested"][0].device),
    "model_device": str(model.weight.device),
    "home": bool(torch.equal(model.weight.detach(), result["weight"])),
    "kernel_cuda": torch.cuda.is_initialized(),
    "again": again["device"],
}))
"""
    )
    assert _last_json(out) == {
        "weight_device": "cpu", "nested_device": "cpu", "model_device": "cpu",
        "home": True, "kernel_cuda": False, "again": "cuda:0",
    }  # fmt: skip


def test_after_a_gpu_run_in_the_kernel_a_fork_is_refused_with_the_reason():
    out = run_fresh(
        COMMON
        + """
notebook_launcher(where, live=False)
try:
    notebook_launcher(where, isolate=True, live=False)
except ForkSafetyError as error:
    print(json.dumps({"refused": str(error)}))
"""
    )
    assert "earlier launch with num_processes=1 trained on the GPU" in _last_json(out)["refused"]


def test_more_processes_than_gpus_run_on_cpu_with_the_reason_in_the_banner():
    processes = GPUS + 1
    out = run_fresh(
        COMMON
        + f"""
from notebook_kit import LaunchConfig
from notebook_kit.launch.plan import make_plan
print(make_plan(LaunchConfig(num_processes={processes})).banner())  # live=False prints none
result = notebook_launcher(where, num_processes={processes}, live=False)
print(json.dumps(result))
"""
    )
    assert "the workers run on CPU (gloo)" in out
    assert _last_json(out) == {"device": "cpu", "backend": "gloo"}


def test_a_bare_driver_context_is_refused():
    out = run_fresh(
        COMMON
        + """
import ctypes
assert ctypes.CDLL("libcuda.so.1").cuInit(0) == 0
try:
    notebook_launcher(where, num_processes=2, live=False)
except ForkSafetyError as error:
    print(json.dumps({"refused": str(error)}))
"""
    )
    assert "A library other than torch created a CUDA context" in _last_json(out)["refused"]


def test_a_cupy_context_is_refused():
    pytest.importorskip("cupy", reason="cupy is not installed")
    out = run_fresh(
        COMMON
        + """
import cupy
float(cupy.zeros(4).sum())
try:
    notebook_launcher(where, isolate=True, live=False)
except ForkSafetyError as error:
    print(json.dumps({"refused": str(error)}))
"""
    )
    assert "A library other than torch created a CUDA context" in _last_json(out)["refused"]


def test_bf16_and_fp16_steps_on_cuda_with_an_overflow_skipped():
    out = run_fresh(
        COMMON
        + """
def steps(precision):
    accelerator = Accelerator(mixed_precision=precision)
    model = nn.Linear(8, 8)
    inner = []
    model.register_forward_hook(lambda m, i, o: inner.append(str(o.dtype)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    prepared, optimizer = accelerator.prepare(model, optimizer)
    before = model.weight.detach().clone()
    loss = prepared(torch.randn(4, 8, device=accelerator.device)).float().pow(2).mean()
    if precision == "fp16":
        loss = loss * float("inf")
    accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
    return {"same_object": prepared is model, "inner": inner[0],
            "skipped": accelerator.optimizer_step_was_skipped,
            "unchanged": bool(torch.equal(before, model.weight.detach())),
            "device": str(accelerator.device)}
print(json.dumps({p: notebook_launcher(steps, args=(p,), isolate=True, live=False)
                  for p in ("bf16", "fp16")}))
"""
    )
    result = _last_json(out)
    assert result["bf16"] == {"same_object": True, "inner": "torch.bfloat16", "skipped": False,
                              "unchanged": False, "device": "cuda:0"}  # fmt: skip
    assert result["fp16"] == {"same_object": True, "inner": "torch.float16", "skipped": True,
                              "unchanged": True, "device": "cuda:0"}  # fmt: skip


def test_under_torchrun_the_accelerator_uses_the_gpu(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import json, torch\nfrom notebook_kit import Accelerator\n"
        "a = Accelerator(mixed_precision='bf16')\n"
        "print(json.dumps({'device': str(a.device), "
        "'backend': torch.distributed.get_backend()}))\n"
    )
    environment = {**os.environ}
    environment.pop("PYTEST_CURRENT_TEST", None)
    done = subprocess.run(
        [sys.executable, "-m", "notebook_kit", "launch", "--num-processes", "1", str(script)],
        capture_output=True, text=True, timeout=240, env=environment,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.lstrip().startswith("{") or "{" in x)
    assert json.loads(line[line.index("{") :]) == {"device": "cuda:0", "backend": "nccl"}
