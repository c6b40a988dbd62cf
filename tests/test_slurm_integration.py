"""SLURM for real: Debian's slurmctld and two slurmd on this host (tests/slurm.py), one per module.

Two ways users train on SLURM, each run through the real controller:
- from a notebook: dask-jobqueue's ``SLURMCluster`` submits one Dask worker per job, and
  ``notebook_launcher(cluster=client)`` runs a node on each;
- from a batch script: ``sbatch`` of two tasks, each ``srun notebook-kit launch train.py``,
  which reads its node's place from SLURM's variables.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import notebook_kit
from notebook_kit import notebook_launcher
from notebook_kit.errors import WorkerError
from tests.notebook_text import export_for_nodes
from tests.optional import needs
from tests.processes import free_port
from tests.slurm import PARTITION, SEARCH_PATH, slurm_cluster, unavailable

ROOT = Path(__file__).resolve().parents[1]
_WHY = unavailable()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    needs("distributed", what="cluster runs"),
    needs("dask_jobqueue", what="Dask workers as SLURM jobs"),
    pytest.mark.skipif(_WHY is not None, reason=_WHY or ""),
]

# Marks the processes this module starts, so a leftover check counts only them.
_MARK, _TOKEN = "NK_SLURM_TEST_RUN", secrets.token_hex(8)
STOP_BOUND_S = 30.0  # Stop pressed: every node ended and the call returned
LOST_BOUND_S = 60.0  # a job cancelled: "node N lost"
LEFTOVER_BOUND_S = 30.0  # scancel: every process of the job gone


@pytest.fixture(scope="module")
def slurm():
    with slurm_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def jobqueue(slurm, tmp_path_factory):
    """Two Dask workers, each the one task of a SLURM job, and a client of their scheduler."""
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    logs = tmp_path_factory.mktemp("jobqueue")
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = slurm.environment["SLURM_CONF"]  # sbatch, squeue, scancel
    try:
        with (
            SLURMCluster(
                queue=PARTITION,
                cores=1,
                processes=1,
                memory="1GB",
                walltime="00:10:00",
                python=sys.executable,
                scheduler_options={"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
                worker_extra_args=["--host", "127.0.0.1"],
                job_script_prologue=[f"cd {ROOT}", f"export {_MARK}={_TOKEN}"],
                log_directory=str(logs),
                local_directory=str(logs),
            ) as cluster,
            Client(cluster) as client,
        ):
            cluster.scale(jobs=2)
            client.wait_for_workers(2, timeout=120)
            yield cluster, client
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
    slurm.wait_for_no_jobs()
    _wait_until(lambda: not marked_processes(_TOKEN), 30, "the Dask workers' jobs ended")


def marked_processes(token: str) -> list[int]:
    """The processes whose environment holds ``token``: everything one job started."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if process.environ().get(_MARK) == token:
                found.append(process.info["pid"])
    return found


def below_workers(client) -> dict[str, list[int]]:
    """The processes below each Dask worker: a node process, its guardian or ranks (not the
    worker's zygote, kept for the next run)."""

    def children() -> list[int]:
        import psutil

        def name(process: psutil.Process) -> str:
            try:
                return process.name()
            except psutil.Error:  # ended meanwhile
                return ""

        below = psutil.Process().children(recursive=True)
        return [p.pid for p in below if name(p) != "nk-zygote"]

    return {w: pids for w, pids in client.run(children).items() if pids}


def _wait_until(condition, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {within:g} s"
        time.sleep(0.1)


# -- From a notebook: dask-jobqueue on SLURM --------------------------------------------------


def _all_reduce():
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    return {"sum": total.item(), "world": dist.get_world_size(), "job": os.environ["SLURM_JOB_ID"]}


def test_a_slurm_jobs_cluster_trains_on_two_nodes(jobqueue):
    cluster, client = jobqueue
    result = notebook_launcher(
        _all_reduce, num_processes=1, num_nodes=2, cluster=client, live=False
    )
    assert result["sum"] == 3.0 and result["world"] == 2
    jobs = {job.job_id for job in cluster.workers.values()}
    assert result["job"] in jobs  # rank 0 ran inside a SLURM job of this cluster
    _wait_until(lambda: not below_workers(client), 10, "every node process ended")


class _PressStop:
    """An observer that presses Stop once every rank has logged its third step."""

    def __init__(self) -> None:
        self.info = None
        self.steps: dict[int, int] = {}
        self.pressed_at: float | None = None
        self.summary = None

    def on_start(self, info):
        self.info = info

    def on_output(self, rank, stream, line):
        pass

    def on_metrics(self, batch):
        for _, step, _ in batch.records:
            self.steps[batch.rank] = max(self.steps.get(batch.rank, -1), int(step or 0))
        if self.pressed_at is None and min(self.steps.get(r, -1) for r in (0, 1)) >= 2:
            self.info.stop_flag.set()
            self.pressed_at = time.monotonic()

    def on_tick(self):
        pass

    def on_finish(self, summary):
        self.summary = summary


def _train_until_stopped():
    step = 0
    while step < 1_000_000:
        dist.all_reduce(torch.ones(1))
        notebook_kit.log({"loss": 1.0 / (step + 1)}, step=step)
        if notebook_kit.should_stop():
            break
        time.sleep(0.02)
        step += 1
    steps = [None, None]
    dist.all_gather_object(steps, step)
    return steps


def test_the_stop_button_ends_a_run_on_slurm_jobs(jobqueue):
    _, client = jobqueue
    observer = _PressStop()
    steps = notebook_launcher(
        _train_until_stopped, num_processes=1, num_nodes=2, cluster=client, observer=observer
    )
    assert observer.pressed_at is not None
    assert time.monotonic() - observer.pressed_at < STOP_BOUND_S
    assert steps[0] == steps[1] < 1_000_000  # every node stopped at the same step
    assert observer.summary.stopped
    _wait_until(lambda: not below_workers(client), 10, "every node process ended")


def _train_forever(started: str):
    open(f"{started}{dist.get_rank()}", "w").close()
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.05)


def test_a_cancelled_job_is_a_lost_node(jobqueue, slurm, tmp_path):
    """The module's last run on the jobs' cluster: it ends with one job fewer."""
    cluster, client = jobqueue
    started = str(tmp_path / "started-")
    addresses = sorted(client.scheduler_info()["workers"])
    names = {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}
    victim = addresses[1]
    job = cluster.workers[names[victim]].job_id
    cancelled: dict[str, float] = {}

    def cancel_once_both_train() -> None:
        _wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 2, 120, "both ranks")
        slurm.run("scancel", job)
        cancelled["at"] = time.monotonic()

    canceller = threading.Thread(target=cancel_once_both_train)
    canceller.start()
    with pytest.raises(WorkerError, match=r"node \d lost") as caught:
        notebook_launcher(
            _train_forever, args=(started,), num_processes=1, num_nodes=2, cluster=client,
            live=False,
        )  # fmt: skip
    canceller.join()
    assert time.monotonic() - cancelled["at"] < LOST_BOUND_S
    assert len(caught.value.lost_nodes) == 1
    _wait_until(lambda: job not in slurm.jobs(), 60, "the cancelled job gone")
    _wait_until(lambda: not below_workers(client), 10, "the other node's processes ended")


# -- From a batch script: sbatch, srun notebook-kit launch ------------------------------------

TRAIN_SCRIPT = """\
import os, sys, time
import torch
import torch.distributed as dist
from notebook_kit import Accelerator

accelerator = Accelerator()
model = accelerator.prepare(torch.nn.Linear(4, 1))
loss = model(torch.ones(2, 4)).sum()
accelerator.backward(loss)
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} on {os.environ['SLURMD_NODENAME']} "
      f"sum {total.item():g}", flush=True)
if len(sys.argv) > 1:  # wait to be cancelled
    open(f"{sys.argv[1]}{dist.get_rank()}", "w").close()
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.05)
"""


def batch_script(port: int, processes: int, token: str, script: Path, *args: str) -> str:
    """The batch script docs/scale_out.md shows, for CPUs: one task per node runs the launcher."""
    return textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --job-name=train
        #SBATCH --nodes=2
        #SBATCH --ntasks-per-node=1
        #SBATCH --cpus-per-task=1
        export {_MARK}={token}
        srun {Path(sys.executable).parent / "notebook-kit"} launch --num-processes {processes} \\
            --master-port {port} {script} {" ".join(args)}
        """)


def _submit(slurm, tmp_path: Path, processes: int, token: str, *args: str) -> tuple[str, Path]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    batch = tmp_path / "train.sbatch"
    batch.write_text(batch_script(free_port(), processes, token, script, *args))
    output = tmp_path / "slurm-%j.out"
    submitted = slurm.run(
        "sbatch", "--parsable", f"--output={output}", f"--chdir={ROOT}", str(batch)
    ).stdout.strip()
    job = submitted.split(";")[0]
    return job, tmp_path / f"slurm-{job}.out"


def test_sbatch_with_srun_notebook_kit_launch_trains_on_two_nodes(slurm, tmp_path):
    job, output = _submit(slurm, tmp_path, 2, secrets.token_hex(8))
    _wait_until(lambda: job not in slurm.jobs(), 180, f"job {job} finished")
    # Two ranks of a node print at once into the job's one output file, and with
    # PYTHONUNBUFFERED a line's text and its newline are two writes: lines may interleave.
    lines = re.findall(r"rank \d of \d on \w+ sum [\d.]+", output.read_text())
    assert sorted(lines) == [
        "rank 0 of 4 on nk1 sum 10",
        "rank 1 of 4 on nk1 sum 10",
        "rank 2 of 4 on nk2 sum 10",
        "rank 3 of 4 on nk2 sum 10",
    ], output.read_text()


def test_scancel_of_a_running_job_leaves_no_process(slurm, tmp_path):
    started = str(tmp_path / "started-")
    token = secrets.token_hex(8)
    job, _ = _submit(slurm, tmp_path, 2, token, started)
    _wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 4, 180, "all four ranks")
    assert len(marked_processes(token)) >= 6  # srun, and on each node the launcher and 2 ranks
    slurm.run("scancel", job)
    _wait_until(
        lambda: not marked_processes(token), LEFTOVER_BOUND_S, "every process of the job gone"
    )
    _wait_until(lambda: job not in slurm.jobs(), 60, f"job {job} gone")


def test_the_exported_slurm_batch_script_trains_on_two_nodes(slurm, tmp_path):
    """notebook-kit export --slurm writes the batch script; sbatch runs it as written."""
    script = export_for_nodes(
        tmp_path, "--slurm", "--nodes", "2", "--master-port", str(free_port())
    )
    batch = script.with_suffix(".sbatch")
    environment = {**slurm.environment, "PATH": f"{Path(sys.executable).parent}:{SEARCH_PATH}"}
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path / 'out.txt'}", str(batch)],
        env=environment, cwd=tmp_path, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    job = submitted.stdout.strip().split(";")[0]
    _wait_until(lambda: job not in slurm.jobs(), 180, f"job {job} finished")
    output = (tmp_path / "out.txt").read_text()
    assert "node 0 trained (2, 2.0)" in output and "node 1 trained (2, 2.0)" in output, output
