"""A warm WorkerPool against a fresh launch: a trivial cell's latency, and compiling only once.

Run from the repository root::

    .venv/bin/python -m benchmarks.pool [--cells 200] [--launches 5] [--quick]

Part 1, in a real Jupyter kernel with a warm 2-process pool (``%%distributed -n 2``):

- ``magic``: a trivial ``%%distributed`` cell (``x = 1``), timed inside the kernel around
  ``run_cell_magic`` (what the magic adds to a cell), median of ``--cells``;
- ``cell_roundtrip``: the same cell from the client's side (execute request to idle), beside a
  plain kernel cell ``x = 1`` (what any cell costs over Jupyter's messaging);
- ``launcher``: ``notebook_launcher`` of a trivial function on 2 fresh processes, in the same
  kernel (``live=False``, and with the default live view).

Part 2, from plain Python: a model compiled with ``torch.compile`` on the workers; the compile
count (dynamo's unique graphs) and the time of each ``pool.run`` of a training step, against a
``notebook_launcher`` per step, which compiles in fresh workers every time.

Part 3 (:mod:`benchmarks.pool_reload`): an edited module on a warm pool, 2 local ranks and a
2-node Dask ``LocalCluster``: the cell right after the edit (every rank answering with the new
code) against the same cell with nothing edited, as a ratio and in seconds (goal: <= 1 s).
``--reload-only`` runs this part alone.

Results go to ``benchmarks/results/pool.json`` and ``pool.md`` (``--out`` to change). Timings
on a shared machine vary; the JSON keeps every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import run_cell
from benchmarks.pool_reload import reload_part, reload_report

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_MS = 5.0

KERNEL_SETUP = """
import json, time
from notebook_kit import notebook_launcher
def nothing():
    return 1
"""
TIME_MAGIC = """
samples = []
for _ in range({count}):
    started = time.perf_counter()
    get_ipython().run_cell_magic("distributed", "", "x = 1")
    samples.append(time.perf_counter() - started)
print("JSON" + json.dumps(samples))
"""
TIME_LAUNCHER = """
samples = []
for _ in range({count}):
    started = time.perf_counter()
    notebook_launcher(nothing, num_processes=2{live})
    samples.append(time.perf_counter() - started)
print("JSON" + json.dumps(samples))
"""


def _kernel_part(cells: int, launches: int) -> dict[str, list[float]]:
    from jupyter_client.manager import start_new_kernel

    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = os.pathsep.join([str(RESULTS.parents[1]), env.get("PYTHONPATH", "")])
    manager, client = start_new_kernel(kernel_name="python3", env=env)
    try:
        run_cell(client, "%load_ext notebook_kit\n" + KERNEL_SETUP)
        run_cell(client, "%%distributed -n 2\nimport torch.distributed as dist\ndist.get_rank()")
        figures = {"magic": _samples(client, TIME_MAGIC.format(count=cells))}
        for code, key in (("%%distributed\nx = 1", "cell_roundtrip"), ("x = 1", "plain_cell")):
            figures[key] = [_roundtrip(client, code) for _ in range(max(cells // 4, 5))]
        for live, key in ((", live=False", "launcher_quiet"), ("", "launcher_live")):
            figures[key] = _samples(client, TIME_LAUNCHER.format(count=launches, live=live))
        return figures
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _samples(client: Any, code: str) -> list[float]:
    text = "".join(m["content"].get("text", "") for m in run_cell(client, code))
    return json.loads(text.split("JSON", 1)[1].splitlines()[0])


def _roundtrip(client: Any, code: str) -> float:
    started = time.perf_counter()
    run_cell(client, code)
    return time.perf_counter() - started


COMPILE_SETUP = """
import torch
from torch._dynamo.utils import counters
torch.manual_seed(0)
model = torch.compile(torch.nn.Sequential(
    torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
"""


def _pool_step() -> tuple[float, int]:
    """One training step of the workers' compiled model: seconds, dynamo graphs so far."""
    import torch
    from torch._dynamo.utils import counters

    import __main__

    started = time.perf_counter()
    loss = __main__.model(torch.randn(32, 64)).square().mean()
    loss.backward()
    __main__.optimizer.step()
    return time.perf_counter() - started, int(counters["stats"]["unique_graphs"])


def _launched_step() -> tuple[float, int]:
    """The same step in a fresh worker: build, compile, step."""
    import torch
    from torch._dynamo.utils import counters

    started = time.perf_counter()
    model = torch.compile(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    )
    model(torch.randn(32, 64)).square().mean().backward()
    return time.perf_counter() - started, int(counters["stats"]["unique_graphs"])


def _compile_part(runs: int) -> dict[str, list[Any]]:
    from notebook_kit import WorkerPool, notebook_launcher

    figures: dict[str, list[Any]] = {"pool_step": [], "launch_step": []}
    with WorkerPool(num_processes=2, live=False) as pool:
        pool.run_cell(COMPILE_SETUP)
        for _ in range(runs):
            figures["pool_step"].append(pool.run(_pool_step))
    for _ in range(runs):
        step = notebook_launcher(_launched_step, num_processes=2, live=False)
        figures["launch_step"].append(step)
    return figures


def _report(figures: dict[str, Any]) -> str:
    def median_ms(key: str) -> float:
        return statistics.median(figures[key]) * 1000

    lines = [
        "| what | median | samples |",
        "|---|---|---|",
        f"| `%%distributed` trivial cell, in the kernel (target <= {TARGET_MS:g} ms) "
        f"| {median_ms('magic'):.2f} ms | {len(figures['magic'])} |",
        f"| same cell, client round trip | {median_ms('cell_roundtrip'):.1f} ms "
        f"| {len(figures['cell_roundtrip'])} |",
        f"| plain kernel cell `x = 1`, client round trip | {median_ms('plain_cell'):.1f} ms "
        f"| {len(figures['plain_cell'])} |",
        f"| fresh `notebook_launcher`, 2 processes, live=False | "
        f"{median_ms('launcher_quiet'):.0f} ms | {len(figures['launcher_quiet'])} |",
        f"| fresh `notebook_launcher`, 2 processes, live view | "
        f"{median_ms('launcher_live'):.0f} ms | {len(figures['launcher_live'])} |",
        "",
        "| compiled step | call 1 | later calls | dynamo graphs after each call |",
        "|---|---|---|---|",
    ]
    for key, label in (("pool_step", "`pool.run` on a warm pool"), ("launch_step", "fresh launch")):
        runs = figures[key]
        later = statistics.median(seconds for seconds, _ in runs[1:]) if len(runs) > 1 else 0
        graphs = ", ".join(str(count) for _, count in runs)
        lines.append(f"| {label} | {runs[0][0] * 1000:.0f} ms | {later * 1000:.1f} ms | {graphs} |")
    return "\n".join(lines) + "\n" + reload_report(figures["reload"])


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--cells", type=int, default=200)
    cli.add_argument("--launches", type=int, default=5)
    cli.add_argument("--compile-runs", type=int, default=3)
    cli.add_argument("--reload-runs", type=int, default=5)
    cli.add_argument("--reload-only", action="store_true", help="only the edited-module part")
    cli.add_argument("--quick", action="store_true", help="few samples: checks it runs")
    cli.add_argument("--out", type=Path, default=RESULTS)
    arguments = cli.parse_args()
    if arguments.quick:
        arguments.cells, arguments.launches, arguments.compile_runs = 20, 1, 2
        arguments.reload_runs = 2
    if arguments.reload_only:
        print(reload_report(reload_part(arguments.reload_runs)))
        return
    figures: dict[str, Any] = _kernel_part(arguments.cells, arguments.launches)
    figures.update(_compile_part(arguments.compile_runs))
    figures["reload"] = reload_part(arguments.reload_runs)
    figures["machine"] = {"cpus": os.cpu_count(), "load_average": os.getloadavg()}
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "pool.json").write_text(json.dumps(figures, indent=1))
    table = _report(figures)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    note = f"\n\n{os.cpu_count()} cores, load average {load} at the end (a shared machine).\n"
    (arguments.out / "pool.md").write_text(table + note)
    print(table + note)


if __name__ == "__main__":
    sys.exit(main())
