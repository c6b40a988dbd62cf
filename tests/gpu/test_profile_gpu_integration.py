"""``accelerator.profile()`` on a real GPU: the trace holds the GPU's kernels, as Accelerate's."""

from __future__ import annotations

import json

from tests.gpu.conftest import run_fresh


def test_a_forked_gpu_rank_writes_a_trace_with_cuda_kernels(tmp_path):
    out = run_fresh(
        f"""
import json, os, torch
from notebook_kit import Accelerator, ProfileKwargs, notebook_launcher

def profiled():
    kwargs = ProfileKwargs(activities=["cpu", "cuda"], output_trace_dir={str(tmp_path)!r})
    accelerator = Accelerator(kwargs_handlers=[kwargs])
    with accelerator.profile() as prof:
        x = torch.randn(1024, 1024, device=accelerator.device)
        (x @ x).sum().item()
    return str(accelerator.device)

device = notebook_launcher(profiled, num_processes=1, isolate=True, live=False)
print(json.dumps({{"device": device, "files": sorted(os.listdir({str(tmp_path)!r}))}}))
"""
    )
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"device": "cuda:0", "files": ["profile_0.json"]}
    events = json.loads((tmp_path / "profile_0.json").read_text())["traceEvents"]
    assert any(event.get("cat") == "kernel" for event in events)  # the GPU's own kernels
