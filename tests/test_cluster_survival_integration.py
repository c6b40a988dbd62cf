"""Cluster runs that survive what clusters do, on a real Dask LocalCluster of two workers:

- a Dask worker SIGKILLed after the first checkpoint: the run restarts on what is left and
  finishes with the right final step, resumed from the checkpoint, one continuous history;
- fewer workers than ``min_nodes`` for a restart: a clear error once the wait's bound passed;
- SIGTERM to a node process, or to a Dask worker alone (a preempted VM, a deleted pod):
  ``should_stop()`` on every rank at the same step, with the reason, then a saved checkpoint.

The module shares one LocalCluster; the test that retires a worker has its own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import notebook_kit
from notebook_kit import notebook_launcher
from notebook_kit.errors import WorkerError
from notebook_kit.live import notebook_view
from tests.optional import needs
from tests.test_cluster_integration import assert_nothing_left, local_cluster
from tests.test_live import Cell
from tests.test_preemption_integration import _until_told

pytestmark = [pytest.mark.integration, needs("distributed", what="cluster runs")]

_STEPS = 30
_EVERY = 5  # a checkpoint after steps 4, 9, 14, ...


@pytest.fixture(scope="module")
def client():
    with local_cluster() as client:
        yield client


def _train(project: str, marks: str, pace: float):
    """A DDP loop that resumes from its newest checkpoint; returns (final step, start step)."""
    from notebook_kit import Accelerator

    accelerator = Accelerator(project_dir=project)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    progress = {"step": -1}
    accelerator.register_for_checkpointing(_Counter(progress))
    accelerator.load_state()  # None on the first attempt
    start = progress["step"] + 1
    attempt = float(os.environ["NOTEBOOK_KIT_RESTART_COUNT"])
    Path(marks, f"start-{dist.get_world_size()}-{start}").touch()
    for step in range(start, _STEPS):
        loss = model(torch.ones(8, 4)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        notebook_kit.log({"loss": loss.item(), "attempt": attempt}, step=step)
        progress["step"] = step
        if step % _EVERY == _EVERY - 1:
            accelerator.save_state()
            Path(marks, f"saved-{step}").touch()
        time.sleep(pace)
    return progress["step"], start


class _Counter:
    def __init__(self, progress: dict[str, int]) -> None:
        self.progress = progress

    def state_dict(self) -> dict[str, int]:
        return dict(self.progress)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.progress.update(state)


def _node_1_pid(client) -> int:
    pids = client.run(os.getpid)
    return pids[sorted(pids)[1]]  # nodes are the workers in address order (one host)


def _when(path: Path, then, within: float = 90.0) -> threading.Thread:
    """Run ``then()`` once ``path`` exists (in a thread; joined by the test)."""

    def wait() -> None:
        deadline = time.monotonic() + within
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if path.exists():
            then()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_a_run_that_loses_a_dask_worker_restarts_on_what_is_left_from_its_checkpoint(
    client, tmp_path, capsys, monkeypatch
):
    """Shown in the notebook's live view: one view, whose summary counts every step once."""
    cell = Cell()
    monkeypatch.setattr(notebook_view, "display", cell.display)
    worker = _node_1_pid(client)
    marks = tmp_path / "marks"
    marks.mkdir()
    killer = _when(marks / "saved-4", lambda: os.kill(worker, signal.SIGKILL))
    final, start = notebook_launcher(
        _train, args=(str(tmp_path / "project"), str(marks), 0.15), num_processes=1,
        num_nodes=2, min_nodes=1, max_restarts=1, cluster=client,
        observer=notebook_view.LiveObserver(),
    )  # fmt: skip
    killer.join()
    assert final == _STEPS - 1
    assert start > 0 and start % _EVERY == 0, start  # resumed after a checkpoint
    out = capsys.readouterr().out
    assert "node 1 lost" in out and "restart 1 of 1" in out, out
    record = notebook_kit.last_run()
    first, last = record.attempts
    assert first.outcome == "failed" and "node 1" in first.failure
    assert first.world_size == 2 and first.first_step == 0
    assert last.outcome == "success" and last.first_step == start
    assert (marks / f"start-{last.world_size}-{start}").exists()
    # One continuous history: every step once, the replayed ones replaced, not added.
    steps = [step for step, _ in record.metrics["loss"]]
    assert steps == list(range(_STEPS))
    assert record.metrics["attempt"] == [(step, float(step >= start)) for step in steps]
    summary = cell.shown()[0]["text/plain"]  # then the plot and the ranks' output, once
    assert [b for b in cell.shown() if "nk-summary" in b.get("text/html", "")] == cell.shown()[:1]
    assert f" · {_STEPS} steps · " in summary and "after 1 restart" in summary, summary
    client.wait_for_workers(2, timeout=60)  # the nanny restarts the killed worker
    assert_nothing_left(client)


def _stops_and_saves_when_signalled(client, tmp_path: Path, target) -> None:
    """SIGTERM to ``target(marks)`` mid-run: every rank stops at one step, with the reason,
    and saves."""
    marks = tmp_path / "marks"
    marks.mkdir()

    def preempt() -> None:
        time.sleep(0.3)  # mid-run
        os.kill(target(marks), signal.SIGTERM)

    sender = _when(marks / "rank-1", preempt)
    step, reason = notebook_launcher(
        _until_told, args=(str(tmp_path / "project"), str(marks)), num_processes=1,
        num_nodes=2, cluster=client, live=False,
    )  # fmt: skip
    sender.join()
    assert (marks / "stopped-0").read_text() == (marks / "stopped-1").read_text() == str(step)
    assert reason.startswith("node 1 received SIGTERM"), reason
    assert (tmp_path / "project" / "checkpoints" / "checkpoint_0" / "checkpoint.json").exists()


def test_sigterm_to_a_node_process_stops_every_rank_at_the_same_step_to_save(
    client, tmp_path, capsys
):
    def node_process(marks: Path) -> int:
        guardian = int((marks / "rank-1").read_text().split()[1])  # rank 1's parent
        with open(f"/proc/{guardian}/stat") as stat:  # and the guardian's: the node process
            return int(stat.read().rsplit(")", 1)[1].split()[1])

    _stops_and_saves_when_signalled(client, tmp_path, node_process)
    assert "Node 1 received SIGTERM" in capsys.readouterr().out
    assert notebook_kit.last_run().stopped
    assert_nothing_left(client)


def test_sigterm_to_a_dask_worker_lets_its_node_save_then_ends_the_worker(client, tmp_path):
    worker = _node_1_pid(client)  # Kubernetes deleting a pod signals its first process only
    _stops_and_saves_when_signalled(client, tmp_path, lambda marks: worker)
    deadline = time.monotonic() + 30  # and then the worker ends, as SIGTERM asked

    def running() -> bool:  # a worker closing as it is asked may answer with an error
        return worker in client.run(os.getpid, on_error="ignore").values()

    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running()
    client.wait_for_workers(2, timeout=60)  # its nanny starts a new one
    assert_nothing_left(client)


# The restart's wait is 3 s; this bounds it with room for a loaded machine, so that a wait
# without bound fails here saying so, rather than hanging until pytest-timeout ends the run.
_AFTER_THE_LOSS_BOUND_S = 60.0


async def _launch_bounded_after(retire: threading.Thread, **options) -> None:
    launch = asyncio.ensure_future(notebook_kit.notebook_launcher_async(_train, **options))
    await asyncio.get_running_loop().run_in_executor(None, retire.join)
    try:
        await asyncio.wait_for(launch, timeout=_AFTER_THE_LOSS_BOUND_S)
    except TimeoutError as error:
        if not launch.cancelled():
            raise  # the launch's own TimeoutError
        raise AssertionError(
            f"the restart still waited {_AFTER_THE_LOSS_BOUND_S:g} s after the worker left"
        ) from error


@pytest.mark.timeout(240)  # its own bound above, past the breakage check's shorter default
def test_a_restart_with_fewer_workers_than_min_nodes_ends_at_the_bound(tmp_path):
    with local_cluster() as client:  # its own: a retired worker does not come back
        leaving = sorted(client.run(os.getpid))[1]
        marks = tmp_path / "marks"
        marks.mkdir()
        retire = _when(marks / "saved-4", lambda: client.retire_workers([leaving]))
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"min_nodes=2 .*1 was there .*=3 s") as caught:
            launch = _launch_bounded_after(
                retire, args=(str(tmp_path / "project"), str(marks), 0.15), num_processes=1,
                num_nodes=2, min_nodes=2, max_restarts=1, rendezvous_timeout=3, cluster=client,
                live=False,
            )  # fmt: skip
            asyncio.run(launch)
        assert isinstance(caught.value.__cause__, WorkerError)
        assert "node 1 lost" in str(caught.value.__cause__)
        assert time.monotonic() - started < 120
        assert_nothing_left(client)
