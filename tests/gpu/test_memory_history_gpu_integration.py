"""``memory_history=True`` on a real GPU: a rank that runs out of memory saves its allocator's
snapshot, and the error names the largest live allocations and the line that made them.

Each scenario runs in a fresh interpreter (a fresh kernel): one in the kernel itself, one in a
forked rank (``isolate=True``), which reaches the kernel as a ``WorkerError``.
"""

from __future__ import annotations

import json

from tests.gpu.conftest import run_fresh

SCENARIO = """
import json, pickle, re, traceback, torch
from notebook_kit import WorkerError, notebook_launcher

def hog():
    kept = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")  # 512 MiB, kept live
    free, _ = torch.cuda.mem_get_info()
    return kept, torch.empty(4 * free, dtype=torch.uint8, device="cuda")  # more than is there

try:
    notebook_launcher(hog, memory_history=True, live=False, **OPTIONS)
except (WorkerError, torch.OutOfMemoryError) as error:
    text = str(error) if isinstance(error, WorkerError) else "".join(
        traceback.format_exception(error))
    path = re.search(r"Snapshot of its allocations: (\\S+) ", text).group(1)
    snapshot = pickle.load(open(path, "rb"))
    print(json.dumps({"kind": type(error).__name__, "text": text, "path": path,
                      "segments": len(snapshot["segments"])}))
"""


def _ran_out(options: str) -> dict:
    out = run_fresh(f"OPTIONS = {options}\n" + SCENARIO)
    return json.loads(out.strip().splitlines()[-1])


def _names_the_allocations(result: dict) -> None:
    text = result["text"]
    assert "Rank 0 ran out of GPU memory holding" in text
    largest = text[text.index("Largest live allocations, by the line that made them:") :]
    first = largest.splitlines()[1]
    assert "512.00 MiB" in first and "in hog" in first, largest  # the kept tensor's line
    assert result["path"].endswith("rank0.pickle") and result["segments"] >= 1


def test_a_run_in_the_kernel_that_runs_out_ends_with_its_allocations_under_the_traceback():
    result = _ran_out("{'num_processes': 1}")
    assert result["kind"] == "OutOfMemoryError"
    _names_the_allocations(result)


def test_a_forked_rank_that_runs_out_shows_its_allocations_in_the_worker_error():
    result = _ran_out("{'num_processes': 1, 'isolate': True}")
    assert result["kind"] == "WorkerError"
    assert result["text"].index("Traceback of rank 0:") < result["text"].index("Largest live")
    _names_the_allocations(result)
