"""On a real GPU: a kernel that ran ``torch.cuda.init()`` launches from its clean template.

The workers train on the GPU (nccl, world size 1 on one GPU: NCCL cannot put two ranks on
one) and the weights come home into the kernel's model; the banner says why the workers
started from a clean process. Runs in a fresh interpreter (``run_fresh``), as a fresh kernel.
"""

from __future__ import annotations

import json

from tests.gpu.conftest import GPUS, run_fresh


def test_a_kernel_holding_a_cuda_context_trains_on_the_gpu_from_its_template():
    out = run_fresh(
        """
import json, torch
from torch import nn
from notebook_kit import Accelerator, notebook_launcher
from notebook_kit.live.headless import ConsolePrinter

torch.cuda.init()  # the kernel holds a CUDA context: forking it would break CUDA in workers
model = nn.Linear(4, 1)

def train(model):
    accelerator = Accelerator()
    prepared = accelerator.prepare(model)
    with torch.no_grad():
        model.weight.fill_(2.0)
    total = torch.ones(1, device=accelerator.device)
    torch.distributed.all_reduce(total)
    return str(accelerator.device), torch.distributed.get_backend(), total.item()

result = notebook_launcher(
    train, args=(model,), num_processes=PROCESSES, isolate=True, observer=ConsolePrinter()
)
print(json.dumps({"result": result, "weight": model.weight.tolist()}))
""".replace("PROCESSES", str(min(GPUS, 2)))
    )
    assert "holds a CUDA context (made by torch): starting workers from a clean process" in out
    found = json.loads(out.strip().splitlines()[-1])
    device, backend, total = found["result"]
    assert device.startswith("cuda") and backend == "nccl" and total == min(GPUS, 2)
    assert found["weight"] == [[2.0, 2.0, 2.0, 2.0]]
