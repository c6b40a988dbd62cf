"""A cluster run that loses a node: from the loss to the first step of the restarted attempt.

Part of ``python -m benchmarks.checkpoints`` (its last section); on its own::

    .venv/bin/python -m benchmarks.node_loss [--rounds 3]

Each round runs the same DDP function on a ``LocalCluster`` of 2 worker processes
(``num_nodes=2, num_processes=1, min_nodes=1, max_restarts=1``): it resumes from its newest
checkpoint, saves one every 5 steps to a folder both nodes share, and writes the wall time of
its first step. Once the first checkpoint is saved, node 1's Dask worker is SIGKILLed.

- **restart**: from the SIGKILL to the first step of the restarted attempt (the loss noticed,
  every node ended, workers chosen and probed again, the nodes started, the group formed,
  the checkpoint loaded);
- **fresh start**, the baseline of the same round: from the call to the first step of the
  first attempt (workers probed, the function sent, nodes started, group formed).

Medians over the rounds, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

STEPS = 20
EVERY = 5


def train(project: str, marks: str) -> int:
    """The workload: resumes from the newest checkpoint; writes when its first step was done."""
    import os
    import time
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from notebook_kit import Accelerator

    accelerator = Accelerator(project_dir=project)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    step = torch.zeros(1)

    class Step:
        def state_dict(self) -> dict:
            return {"step": int(step.item())}

        def load_state_dict(self, state: dict) -> None:
            step.fill_(state["step"])

    accelerator.register_for_checkpointing(Step())
    accelerator.load_state()
    attempt = os.environ["NOTEBOOK_KIT_RESTART_COUNT"]
    first = True
    while step.item() < STEPS:
        accelerator.backward(model(torch.ones(16, 64)).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        if first and dist.get_rank() == 0:
            Path(marks, f"first-{attempt}").write_text(repr(time.time()))
            first = False
        if int(step.item()) % EVERY == 0:
            accelerator.save_state()
            Path(marks, f"saved-{int(step.item())}").touch()
        time.sleep(0.1)
    return int(step.item())


def one_round(client, workdir: Path) -> tuple[float, float]:
    """(fresh start, restart) seconds of one run that loses node 1 after its first save."""
    from notebook_kit import notebook_launcher

    pids = client.run(os.getpid)
    worker = pids[sorted(pids)[1]]
    marks = workdir / "marks"
    marks.mkdir()
    killed: list[float] = []

    def kill() -> None:
        while not (marks / f"saved-{EVERY}").exists():
            time.sleep(0.005)
        killed.append(time.time())
        os.kill(worker, signal.SIGKILL)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    called = time.time()
    final = notebook_launcher(
        train, args=(str(workdir / "project"), str(marks)), num_processes=1, num_nodes=2,
        min_nodes=1, max_restarts=1, cluster=client, live=False,
    )  # fmt: skip
    killer.join()
    assert final == STEPS, final
    fresh = float((marks / "first-0").read_text()) - called
    restart = float((marks / "first-1").read_text()) - killed[0]
    client.wait_for_workers(2, timeout=120)  # the nanny restarts the killed worker
    return fresh, restart


def measure(rounds: int) -> dict[str, float]:
    """Medians over ``rounds`` of the fresh start and of the restart after a node's loss."""
    import cloudpickle
    from distributed import Client, LocalCluster

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the nodes import nothing here
    fresh, restart = [], []
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as folder:
                seconds = one_round(client, Path(folder))
            fresh.append(seconds[0])
            restart.append(seconds[1])
            print(f"fresh start {seconds[0]:.2f} s, restart after the loss {seconds[1]:.2f} s")
    return {
        "rounds": rounds,
        "fresh_start_s": statistics.median(fresh),
        "restart_s": statistics.median(restart),
    }


def section(figures: dict[str, float]) -> str:
    """The markdown section of ``benchmarks/results/checkpoints.md``."""
    ratio = figures["restart_s"] / figures["fresh_start_s"]
    return "\n".join(
        [
            "## A cluster run that loses a node",
            "",
            f"`LocalCluster` of 2 worker processes, 1 rank per node, `min_nodes=1, "
            f"max_restarts=1`; node 1's Dask worker SIGKILLed after the first checkpoint. "
            f"Medians over {figures['rounds']} rounds.",
            "",
            "| | seconds | ratio |",
            "| --- | ---: | ---: |",
            f"| fresh start: call to first step (baseline) | {figures['fresh_start_s']:.2f} "
            "| 1.00 |",
            f"| restart: node lost to first step of the restarted attempt "
            f"| {figures['restart_s']:.2f} | {ratio:.2f} |",
            "",
            "The restart includes noticing the loss (the scheduler sees the worker leave), "
            "ending every node, choosing and probing the workers again, starting the nodes, "
            "forming the group on the new world size and loading the checkpoint.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    print(section(measure(parser.parse_args().rounds)))


if __name__ == "__main__":
    main()
