"""Cluster runs on a real Dask LocalCluster: two worker processes, one rank per node, gloo.

Every test ends by checking that no process is left below any Dask worker, and the module's
cluster is reused, so each test also shows the cluster takes the next launch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import notebook_kit
from notebook_kit import notebook_launcher
from notebook_kit.errors import WorkerError
from notebook_kit.node.protocol import LEASE_SECONDS
from tests.optional import needs
from tests.processes import marked_node_processes

pytestmark = [pytest.mark.integration, needs("distributed", what="cluster runs")]

# Marks the environment of this module's Dask workers, so a check for leftovers counts only
# this module's node processes, whatever else runs on the machine.
_MARK, _TOKEN = "NK_CLUSTER_TEST_RUN", secrets.token_hex(8)

# The bounds docs/cluster.md states, with room for a loaded 2-core machine.
FAILURE_BOUND_S = 15.0  # a rank raising or exiting: every node ended, error raised
WORKER_DEATH_BOUND_S = 20.0  # a Dask worker SIGKILLed: "node 1 lost"
INTERRUPT_BOUND_S = 2.0  # Ctrl-C: KeyboardInterrupt raised, every node asked to end
KERNEL_DEATH_BOUND_S = LEASE_SECONDS + 10.0  # the lease runs out, then the nodes end

_KERNEL = """
import sys, time, torch, torch.distributed as dist
from distributed import Client
from notebook_kit import notebook_launcher

def train(marker):
    open(marker + str(dist.get_rank()), "w").close()
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.05)

client = Client(sys.argv[1])
notebook_launcher(train, args=(sys.argv[2],), num_processes=1, num_nodes=2, cluster=client,
                  live=False)
"""


@contextlib.contextmanager
def local_cluster():
    """A LocalCluster of two worker processes and its client (one per test module).

    Tests that kill a worker share it, and its nanny restarts the worker each time. Dask's
    cluster object closes a lost worker's nanny ``lost-worker-timeout`` after the loss when no
    worker of that name is connected then: it checks the name, not the loss. A second kill of
    the same worker, while its nanny restarts it, just as an earlier loss's timeout ends, would
    close that nanny for good, and the module would go on with one worker. The timeout is
    longer than any module here."""
    import dask
    from distributed import Client, LocalCluster

    with (
        dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}),
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",
            env={_MARK: _TOKEN},  # inherited by the node processes of the runs on it
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        yield client


@pytest.fixture(scope="module")
def client():
    with local_cluster() as client:
        yield client


def leftovers(client) -> dict[str, list[int]]:
    """The processes below each Dask worker (a node process, its guardian or ranks), but the
    worker's zygote, which stays warm for the next run."""

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


def node_processes() -> list[int]:
    """This module's node processes, also one its Dask worker no longer holds (an orphan)."""
    return marked_node_processes(_MARK, _TOKEN)


def assert_nothing_left(client, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    left, nodes = leftovers(client), node_processes()
    while (left or nodes) and time.monotonic() < deadline:
        time.sleep(0.1)
        left, nodes = leftovers(client), node_processes()
    assert not left, f"processes left under Dask workers: {left}"
    assert not nodes, f"node processes left: {nodes}"


def _all_reduce(scale):
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} sees {total.item()}")
    return total.item() * scale


def test_all_reduce_metrics_result_and_weights_come_home(client):
    model = torch.nn.Linear(3, 1)
    before = model.weight.detach().clone()

    def train(model):
        from notebook_kit import Accelerator

        accelerator = Accelerator()
        model = accelerator.prepare(model)
        rank = dist.get_rank()
        for step in range(3):
            notebook_kit.log({"loss": float(rank + 1 + step)}, step=step)
        with torch.no_grad():
            model.module.weight.fill_(7.0)
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)
        accelerator.wait_for_everyone()
        trim = os.environ.get("MALLOC_TRIM_THRESHOLD_")  # the nanny's, for its worker only
        return {"sum": total.item(), "world": dist.get_world_size(), "node": os.environ["RANK"],
                "trim": trim}  # fmt: skip

    result = notebook_launcher(
        train, args=(model,), num_processes=1, num_nodes=2, cluster=client, live=False
    )
    assert result == {"sum": 3.0, "world": 2, "node": "0", "trim": None}
    assert torch.equal(model.weight, torch.full_like(before, 7.0))
    assert model.weight.device.type == "cpu"
    record = notebook_kit.last_run()
    assert record is not None
    assert record.metrics["loss"] == [(0, 1.5), (1, 2.5), (2, 3.5)]  # mean over both nodes
    assert_nothing_left(client)


class _Recorder:
    """An observer that keeps everything and presses Stop once both nodes logged step 2."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.lines: list[tuple[int, str]] = []
        self.steps: dict[int, int] = {}
        self.info = None
        self.summary = None
        self.stop_at = stop_at
        self.pressed = False

    def on_start(self, info):
        self.info = info

    def on_output(self, rank, stream, line):
        self.lines.append((rank, line))

    def on_metrics(self, batch):
        for _, step, _ in batch.records:
            self.steps[batch.rank] = max(self.steps.get(batch.rank, -1), int(step or 0))
        seen = [self.steps.get(r, -1) for r in (0, 1)]
        if self.stop_at is not None and min(seen) >= self.stop_at:
            self.info.stop_flag.set()
            self.pressed = True

    def on_tick(self):
        pass

    def on_finish(self, summary):
        self.summary = summary


def _train_until_stopped(limit: int = 100_000):
    from notebook_kit.runtime.context import current_launch
    from notebook_kit.runtime.messages import MetricsBatch

    step = 0
    while step < limit:
        dist.all_reduce(torch.ones(1))
        rank = dist.get_rank()
        current_launch().send(MetricsBatch(rank, ((rank, step, {}),), None, None))
        if notebook_kit.should_stop():
            break
        time.sleep(0.01)
        step += 1
    steps = [None, None]
    dist.all_gather_object(steps, step)
    print(f"stopped at {step}")
    return steps


STOP_BOUND_S = 60.0  # Stop pressed at step 2: every node has stopped well within this


def test_stop_ends_every_node_at_the_same_step_and_output_has_global_ranks(client):
    recorder = _Recorder(stop_at=2)
    try:
        steps = notebook_launcher(
            _train_until_stopped, num_processes=1, num_nodes=2, cluster=client,
            observer=recorder, timeout=STOP_BOUND_S,
        )  # fmt: skip
    except TimeoutError:
        assert recorder.pressed, f"no rank logged step 2 within {STOP_BOUND_S:g} s"
        pytest.fail(
            f"Stop was pressed once both ranks logged step 2, yet the nodes trained on for "
            f"{STOP_BOUND_S:g} s: Stop did not reach the nodes' ranks"
        )
    assert steps[0] == steps[1] < 100_000
    assert recorder.summary.stopped
    assert {rank for rank, line in recorder.lines if line.startswith("stopped at")} == {0, 1}
    assert recorder.info.world_size == 2 and recorder.info.ranks == (0, 1)
    assert recorder.info.node_of() == {0: 0, 1: 1}  # the view shows each rank's node
    assert_nothing_left(client)


def test_the_await_form_runs_on_the_cluster_and_its_event_loop_serves_stop(client):
    """Stop is pressed by another task of the event loop the run is awaited on, as a widget
    event is: it can only arrive while the loop is free during the run."""
    from notebook_kit import notebook_launcher_async

    recorder = _Recorder()

    async def press_stop_at_step_2():
        while min(recorder.steps.get(r, -1) for r in (0, 1)) < 2:
            await asyncio.sleep(0.02)
        recorder.info.stop_flag.set()

    async def main():
        pressing = asyncio.ensure_future(press_stop_at_step_2())
        try:
            return await notebook_launcher_async(
                _train_until_stopped, args=(1000,), num_processes=1, num_nodes=2,
                cluster=client, observer=recorder,
            )  # fmt: skip
        finally:
            pressing.cancel()

    steps = asyncio.run(asyncio.wait_for(main(), timeout=120))
    assert steps[0] == steps[1] < 1000 and recorder.summary.stopped  # not at its limit
    assert {rank for rank, line in recorder.lines if line.startswith("stopped at")} == {0, 1}
    assert recorder.info.node_of() == {0: 0, 1: 1}
    assert_nothing_left(client)


def test_a_local_launch_in_the_kernel_leaves_its_local_clusters_workers_running(client):
    """The LocalCluster's worker processes are the kernel's multiprocessing children, which
    the forked ranks inherit the list of; a rank ending must not terminate them."""
    before = client.run(os.getpid)
    assert notebook_launcher(_all_reduce, args=(1.0,), num_processes=2, live=False) == 3.0
    time.sleep(0.5)  # a terminated worker is gone from the scheduler within this
    assert client.run(os.getpid) == before


def _raise_on_node_1(marker: str):
    if dist.get_rank() == 1:
        Path(marker).write_text(str(time.time()))
        raise ValueError("bad batch on the second machine")
    time.sleep(60)  # no collective: only the kernel can end node 0 in time


def _exit_on_node_1(marker: str):
    if dist.get_rank() == 1:
        Path(marker).write_text(str(time.time()))
        os._exit(3)
    time.sleep(60)


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        (_raise_on_node_1, "ValueError: bad batch on the second machine"),
        (_exit_on_node_1, "exited with code 3"),
    ],
    ids=["raises", "os._exit"],
)
def test_a_failing_rank_is_named_with_its_node_and_every_node_ends(
    client, tmp_path, function, expected
):
    marker = tmp_path / "failed"
    with pytest.raises(WorkerError) as caught:
        notebook_launcher(
            function, args=(str(marker),), num_processes=1, num_nodes=2, cluster=client,
            live=False, timeout=40,  # a node left waiting ends here, failing the bound below
        )  # fmt: skip
    elapsed = time.time() - float(marker.read_text())
    error = caught.value
    assert error.rank == 1
    assert f"Rank 1 (node 1, Dask worker {error.nodes[1]}) of 2 failed: {expected}" in str(error)
    if function is _raise_on_node_1:
        assert 'raise ValueError("bad batch on the second machine")' in error.failure.traceback
    assert elapsed < FAILURE_BOUND_S, f"the failure took {elapsed:.1f} s to end the run"
    assert_nothing_left(client)


def _node_zygotes() -> list[int]:
    """Every rank's zygote (rank -> guardian -> node process -> zygote), gathered."""
    import psutil

    zygote = psutil.Process(os.getppid()).parent().ppid()
    gathered: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, zygote)
    return gathered


def test_the_next_launch_forks_its_nodes_from_each_workers_warm_zygote(client):
    """A Dask worker keeps the zygote its first node started: torch is imported once."""
    options = {"cluster": client, "num_nodes": 2, "num_processes": 1, "live": False}
    first = notebook_launcher(_node_zygotes, **options)
    second = notebook_launcher(_node_zygotes, **options)
    assert first == second and len(set(first)) == 2

    def zygotes() -> list[int]:
        import psutil

        return [p.pid for p in psutil.Process().children() if p.name() == "nk-zygote"]

    held = client.run(zygotes)
    assert sorted(first) == sorted(pid for pids in held.values() for pid in pids), held
    assert_nothing_left(client)


def test_a_killed_dask_worker_is_node_lost_and_never_retrains(client, tmp_path):
    pids = client.run(os.getpid)
    starts = tmp_path / "starts"

    def train(starts):
        dist.all_reduce(torch.ones(1))
        with open(starts, "a") as file:
            file.write(f"{dist.get_rank()}\n")
        time.sleep(120)  # an orphaned node would live on: no collective to fail

    worker_1 = sorted(pids)[1]  # nodes are the workers in address order (one host)
    from threading import Timer

    def kill_when_started() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if starts.exists() and len(starts.read_text().split()) == 4:
                os.kill(pids[worker_1], signal.SIGKILL)
                kill_when_started.at = time.monotonic()
                return
            time.sleep(0.05)

    kill_when_started.at = None
    timer = Timer(0, kill_when_started)
    timer.start()
    with pytest.raises(WorkerError, match="node 1 lost: its Dask worker left") as caught:
        notebook_launcher(
            train, args=(str(starts),), num_processes=2, num_nodes=2, cluster=client, live=False
        )
    timer.join()
    assert kill_when_started.at is not None
    assert time.monotonic() - kill_when_started.at < WORKER_DEATH_BOUND_S
    error = caught.value
    assert error.lost_nodes == (1,)
    assert error.rank == 2  # the lost node's first rank: two ranks on each node
    heading = f"Rank 2 (node 1, Dask worker {error.nodes[1]}) of 4 failed: node 1 lost"
    assert heading in str(error), str(error)
    client.wait_for_workers(2, timeout=60)  # the nanny restarts it
    time.sleep(1.0)
    assert sorted(starts.read_text().split()) == ["0", "1", "2", "3"]  # nobody trained twice
    assert_nothing_left(client)
    assert (
        notebook_launcher(
            _all_reduce, args=(1,), num_processes=1, num_nodes=2, cluster=client, live=False
        )
        == 3.0
    )


# -- WorkerPool(cluster=...) ---------------------------------------------------------------


# Functions as a notebook cell defines them (in ``__main__``): sent by value, rebuilt on each
# rank in its namespace, where a global one sets is there for the next run.
_CELL = """
def keep(value):
    import os
    import torch.distributed as dist
    global kept_on_rank
    kept_on_rank = (value, dist.get_rank(), os.getpid())
    return dist.get_rank()

def kept():
    return kept_on_rank
"""


def _cell_functions():
    space = {"__name__": "__main__"}
    exec(_CELL, space)
    return space["keep"], space["kept"]


def _raise_on_node_1_of_pool():
    if dist.get_rank() == 1:
        raise ValueError("bad batch on the second machine")
    for _ in range(300):  # no collective: only the pool's interrupt ends node 0's rank in time
        time.sleep(0.1)  # (between short sleeps: a long one is a C call no interrupt enters)


def test_a_cluster_pool_keeps_its_nodes_and_ranks_between_runs_and_after_a_failure(client):
    from notebook_kit import WorkerPool

    keep, kept = _cell_functions()
    pool = WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False)
    try:
        nodes = sorted(node_processes())
        ranks = pool.pids
        assert len(ranks) == 2 and set(ranks) <= set(nodes)  # node processes and their forks
        assert pool.run(keep, "first") == 0  # rank 0's value
        assert pool.run(kept, ranks="all") == [("first", 0, ranks[0]), ("first", 1, ranks[1])]
        with pytest.raises(WorkerError) as caught:
            pool.run(_raise_on_node_1_of_pool)
        error = caught.value
        assert f"Rank 1 (node 1, Dask worker {error.nodes[1]}) of 2 failed: ValueError" in str(
            error
        )
        assert "workers are still running" in str(error)
        assert pool.run(kept, ranks="all") == [("first", 0, ranks[0]), ("first", 1, ranks[1])]
        assert sorted(node_processes()) == nodes and pool.pids == ranks
        pool.push(x=1)  # every verb of a local pool (tests/test_cluster_pool_integration.py)
        assert pool.run_cell("x + 1") == 2 and pool.pull("x", rank=1) == 1
    finally:
        pool.close()
    assert_nothing_left(client)  # the launches of the tests below take the same cluster


def test_a_cluster_pool_refuses_what_it_cannot_honour_before_anything_starts(client):
    from notebook_kit import WorkerPool

    with pytest.raises(ValueError, match=r"send_limit= is not supported with cluster= yet"):
        WorkerPool(cluster=client, num_nodes=2, num_processes=1, send_limit=5, live=False)
    with pytest.raises(ValueError, match="use_port is chosen by the cluster"):
        WorkerPool(cluster=client, num_nodes=2, num_processes=1, use_port=29500, live=False)
    assert not node_processes()
    assert_nothing_left(client, within=0.0)


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 3 s a launch on an idle 2-core machine, far more when busy
def test_six_launches_in_a_row_leave_nothing_behind(client):
    for _ in range(6):
        assert (
            notebook_launcher(
                _all_reduce, args=(2,), num_processes=1, num_nodes=2, cluster=client, live=False
            )
            == 6.0
        )
    assert_nothing_left(client)
    events = client.run_on_scheduler(
        lambda dask_scheduler: [t for t in dask_scheduler._broker._topics if "notebook_kit" in t]
    )
    assert events == []


def _wait_for(paths, within: float = 120.0) -> None:
    deadline = time.monotonic() + within
    while not all(Path(p).exists() for p in paths):
        assert time.monotonic() < deadline, f"never appeared: {paths}"
        time.sleep(0.05)


def _train_forever(marker: str):
    Path(marker + str(dist.get_rank())).touch()
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.05)


def _press_ctrl_c_once_both_ranks_run(marker: str) -> dict[str, float]:
    """A thread presses Ctrl-C once both ranks have touched their marker; ``["at"]``: when."""
    pressed: dict[str, float] = {}

    def press() -> None:
        _wait_for([marker + "0", marker + "1"])
        pressed["at"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press, daemon=True).start()
    return pressed


def test_ctrl_c_raises_one_keyboard_interrupt_and_ends_every_node(client, tmp_path):
    marker = str(tmp_path / "rank")
    pressed = _press_ctrl_c_once_both_ranks_run(marker)
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(
            _train_forever, args=(marker,), num_processes=1, num_nodes=2, cluster=client,
            live=False,
        )  # fmt: skip
    raised = time.monotonic() - pressed["at"]
    assert raised < INTERRUPT_BOUND_S + 1.0, f"KeyboardInterrupt came {raised:.1f} s after Ctrl-C"
    assert_nothing_left(client, within=5.0)
    assert (
        notebook_launcher(
            _all_reduce, args=(1,), num_processes=1, num_nodes=2, cluster=client, live=False
        )
        == 3.0
    )


_POOL_KERNEL = """
import pathlib, sys, time
import torch.distributed as dist
from distributed import Client
from notebook_kit import WorkerPool

def mark(marker):
    pathlib.Path(marker + str(dist.get_rank())).touch()

pool = WorkerPool(cluster=Client(sys.argv[1]), num_nodes=2, num_processes=1, live=False)
pool.run(mark, sys.argv[2], ranks="all")
time.sleep(600)  # an idle pool, waiting for the next cell
"""


@pytest.mark.parametrize("kernel_code", [_KERNEL, _POOL_KERNEL], ids=["running", "idle-pool"])
def test_a_dead_kernel_ends_every_node_through_its_lease(client, tmp_path, kernel_code):
    marker = str(tmp_path / "rank")
    kernel = subprocess.Popen(
        [sys.executable, "-c", kernel_code, client.scheduler.address, marker],
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())},
    )
    try:
        _wait_for([marker + "0", marker + "1"])
        assert len(node_processes()) >= 2
        kernel.kill()
        killed = time.monotonic()
    finally:
        kernel.kill()
        kernel.wait()
    assert_nothing_left(client, within=KERNEL_DEATH_BOUND_S)
    assert time.monotonic() - killed < KERNEL_DEATH_BOUND_S


def _wait_on_every_rank(marker: str):
    Path(marker + str(dist.get_rank())).touch()
    for _ in range(600):  # short sleeps: the pool's interrupt enters between them
        time.sleep(0.1)
    return "never interrupted"


def test_ctrl_c_during_a_cluster_pool_run_raises_once_and_the_ranks_keep_their_state(
    client, tmp_path
):
    from notebook_kit import WorkerPool

    keep, kept = _cell_functions()
    marker = str(tmp_path / "rank")
    pool = WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False)
    try:
        ranks = pool.pids
        assert pool.run(keep, "before the interrupt") == 0
        pressed = _press_ctrl_c_once_both_ranks_run(marker)
        with pytest.raises(KeyboardInterrupt):
            pool.run(_wait_on_every_rank, marker)
        raised = time.monotonic() - pressed["at"]
        assert raised < INTERRUPT_BOUND_S + 1.0, f"KeyboardInterrupt came {raised:.1f} s later"
        assert pool.run(kept, ranks="all") == [
            ("before the interrupt", 0, ranks[0]),
            ("before the interrupt", 1, ranks[1]),
        ]
        assert pool.pids == ranks
    finally:
        pool.close()
    assert_nothing_left(client)


def test_an_unsubscribe_that_arrives_after_the_clean_up_leaves_no_topic(client):
    """A client's unsubscribe goes on its batched stream and may reach the scheduler after the
    clean-up call: the scheduler must not keep an empty topic for it."""
    from distributed import Client

    from notebook_kit.launch.cluster.engines.dask import forget_on_scheduler as _forget

    topic = f"notebook_kit-{secrets.token_hex(8)}-events"
    with Client(client.scheduler.address) as late:
        late.subscribe_topic(topic, lambda event: None)
        client.log_event(topic, "an event")
        _wait_until(lambda: client.run_on_scheduler(_subscribed, topic))
        forgotten = threading.Thread(
            target=client.run_on_scheduler, args=(_forget, [], [topic]), daemon=True
        )
        forgotten.start()
        time.sleep(0.3)  # the clean-up runs on the scheduler while the subscriber is still there
        late.unsubscribe_topic(topic)
        forgotten.join(timeout=30)
    time.sleep(0.5)  # anything still on its way has arrived
    assert not client.run_on_scheduler(_known_topic, topic)


def _subscribed(topic: str, dask_scheduler=None) -> bool:
    return bool(dask_scheduler._broker._topics[topic].subscribers)


def _known_topic(topic: str, dask_scheduler=None) -> bool:
    return topic in dask_scheduler._broker._topics


def _wait_until(condition, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


def test_a_node_task_run_again_refuses_to_train(client, tmp_path):
    """Dask may run a task again after its worker died: the node must not train twice."""
    from distributed import Variable

    from notebook_kit.node.links.dask import run_node
    from notebook_kit.node.protocol import Control, NodeOrder, NodeSettings, RunNames, control_frame

    names = RunNames("rerun-check")
    Variable(names.control, client=client).set(control_frame(Control()))
    Variable(names.address, client=client).set([])
    Variable(names.started(0), client=client).set("tcp://127.0.0.1:1")  # it ran once already
    settings = NodeSettings(notebook_kit.LaunchConfig(), 60.0, None)
    order = NodeOrder(names.run_id, 0, 1, "127.0.0.1", "lo", b"", settings, "notebook_kit/x/")
    try:
        secret = client.scatter(bytes(32), broadcast=True, hash=False)  # refused before use
        report = client.submit(run_node, order, secret.key, pure=False).result(timeout=120)
    finally:
        for name in names.all_variables(1):
            Variable(name, client=client).delete()
    assert report.ended_by == "refused" and report.outcome is None
    assert_nothing_left(client)


def test_max_restarts_starts_every_node_again(client, tmp_path, capsys):
    first = tmp_path / "first-attempt"

    def train(first: str):
        if dist.get_rank() == 1 and not os.path.exists(first):
            Path(first).touch()
            raise RuntimeError("flaky node")
        total = torch.ones(1)
        dist.all_reduce(total)
        restarts = [None, None]
        dist.all_gather_object(restarts, os.environ["NOTEBOOK_KIT_RESTART_COUNT"])
        return total.item(), restarts

    result = notebook_launcher(
        train, args=(str(first),), num_processes=1, num_nodes=2, cluster=client,
        max_restarts=1, live=False,
    )  # fmt: skip
    assert result == (2.0, ["1", "1"])  # every rank counts the restart, as after a local one
    out = capsys.readouterr().out  # the cause names the rank and its node
    assert "Rank 1 (node 1, Dask worker tcp://" in out, out
    assert "failed (RuntimeError: flaky node); restarting all 2 nodes (restart 1 of 1)" in out
    assert_nothing_left(client)
