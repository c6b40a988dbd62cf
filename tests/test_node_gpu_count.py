"""A cluster probe counts a node's GPUs as the node's torch would, with no torch in the engine
worker: real processes, a real zygote and its child.

The "engine worker" here is a fresh interpreter that runs the probe as a Dask or Ray task would
(``probe_report``) and then says which modules it holds. To see that the count is the node's
own and not a constant, one run gives the zygote a torch that counts three GPUs (a
``sitecustomize`` that only the zygote acts on, as a node whose CUDA sees three), which only a
count taken in the zygote's child can report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

# The worker's side: the probe as an engine's task runs it, then what its process holds.
_WORKER = textwrap.dedent(
    """
    import json, sys
    import cloudpickle
    from notebook_kit.node.probe import probe_report

    payload = cloudpickle.dumps(len)
    counted = probe_report("w", "h", payload, "127.0.0.1")
    given = probe_report("w", "h", payload, "127.0.0.1", gpus=2)
    print(json.dumps({
        "counted": counted.gpus, "given": given.gpus, "rebuild_error": counted.rebuild_error,
        "torch_in_worker": "torch" in sys.modules,
    }))
    """
)

# Imported at every start of an interpreter on the path; acts only in the zygote.
_THREE_GPUS = textwrap.dedent(
    """
    import sys

    if "notebook_kit.node.zygote" in sys.orig_argv:  # python -m notebook_kit.node.zygote ...
        import torch

        torch.cuda.device_count = lambda: 3
    """
)


def _probe_in_a_fresh_worker(extra_path: str | None = None) -> dict:
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", _WORKER], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(150)
def test_the_probe_counts_what_this_machines_torch_sees_and_the_worker_never_imports_torch():
    answer = _probe_in_a_fresh_worker()
    assert answer["torch_in_worker"] is False
    assert answer["rebuild_error"] is None
    assert answer["counted"] == torch.cuda.device_count()
    assert answer["given"] == 2  # an engine that knows its node's GPUs (Ray) keeps its count


@pytest.mark.timeout(150)
def test_the_count_is_the_node_processs_own(tmp_path: Path):
    (tmp_path / "sitecustomize.py").write_text(_THREE_GPUS)
    answer = _probe_in_a_fresh_worker(str(tmp_path))
    assert answer["torch_in_worker"] is False
    assert answer["counted"] == 3
    assert answer["given"] == 2
