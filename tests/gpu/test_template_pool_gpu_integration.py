"""On a real GPU: a kernel that ran ``torch.cuda.init()`` starts a pool from its clean template.

The pool's workers hold the GPU (nccl), keep what a cell defined for the next one, and a
call's trained weights come home into the kernel's model; the pool's banner says why the
workers started from a clean process, and closing it leaves no worker. Runs in a fresh
interpreter (``run_fresh``), as a fresh kernel.
"""

from __future__ import annotations

import json

from tests.gpu.conftest import GPUS, run_fresh


def test_a_pool_in_a_kernel_holding_a_cuda_context_runs_on_the_gpu_from_its_template():
    out = run_fresh(
        """
import json, psutil, torch
from torch import nn
from notebook_kit import Accelerator, WorkerPool

torch.cuda.init()  # the kernel holds a CUDA context: forking it would break CUDA in workers
model = nn.Linear(4, 1)

def train(model):
    accelerator = Accelerator()
    accelerator.prepare(model)
    with torch.no_grad():
        model.weight.fill_(2.0)
    total = torch.ones(1, device=accelerator.device)
    torch.distributed.all_reduce(total)
    return str(accelerator.device), torch.distributed.get_backend(), total.item()

pool = WorkerPool(num_processes=PROCESSES, live=False)
print(pool.where)
workers = pool.pids
result = pool.run(train, model)
pool.run_cell("import torch\\nkept = torch.full((2,), 3.0, device='cuda')")
cell = pool.run_cell("str(kept.device), kept.sum().item()")
pool.close()
left = [pid for pid in workers if psutil.pid_exists(pid)]
print(json.dumps({"result": result, "cell": cell, "weight": model.weight.tolist(), "left": left}))
""".replace("PROCESSES", str(min(GPUS, 2)))
    )
    assert "holds a CUDA context (made by torch): starting workers from a clean process" in out
    found = json.loads(out.strip().splitlines()[-1])
    device, backend, total = found["result"]
    assert device.startswith("cuda") and backend == "nccl" and total == min(GPUS, 2)
    assert found["cell"] == ["cuda:0", 6.0] and found["left"] == []
    assert found["weight"] == [[2.0, 2.0, 2.0, 2.0]]
