"""Launch cost of notebook_kit against a hand-written fork + gloo launcher, in one run.

Run from the repository root::

    .venv/bin/python -m benchmarks.launch

Measures, for ``notebook_launcher`` and ``torch.multiprocessing.start_processes(start_method=
"fork")`` with ``init_process_group("gloo")``, interleaved: launch latency of a function doing
one all_reduce on 2 processes (first launch in a fresh process, and the median of repeats),
the time from a rank raising to the caller's exception, and the extra memory per forked
worker while the caller holds a 1 GiB tensor. Ratios are to the hand-written baseline.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks._harness import MIB

BASELINE = "torch-fork"
FULL_PLAN = {"first": 5, "launch": 15, "failure": 10, "memory": 3}


def main() -> None:
    # Imported here: spawned workers re-import this module and need none of the harness.
    from benchmarks._run import choose, execute, parser

    cli = parser(__doc__.splitlines()[0], ["notebook_kit", BASELINE])
    arguments = cli.parse_args()
    tools, plan, options = choose(arguments, FULL_PLAN)
    print(execute(tools, plan, options, arguments.out, reference=BASELINE, stem="launch"))
    print(_memory_share(arguments.out / "launch.json", options.dataset_bytes))


def _memory_share(path: Path, dataset_bytes: int) -> str:
    """Extra memory per worker as a share of the caller's dataset, for each tool."""
    results = json.loads(path.read_text()).get("mem_uss", {})
    lines = []
    for tool, cell in results.items():
        if cell["values"]:
            worst = max(float(value) for value in cell["values"])
            share = 100 * worst / dataset_bytes
            lines.append(
                f"{tool}: at most {worst / MIB:.1f} MiB private (USS) per worker = {share:.2f}% "
                f"of the {dataset_bytes / MIB:,.0f} MiB dataset"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
