"""Cluster runs on a real Ray runtime: ``notebook_launcher(cluster="ray")`` and
``WorkerPool(cluster="ray")``, two nodes of one rank placed on this machine's one Ray node.

The module starts one Ray runtime (its start-up is slow) and every test takes it, so each also
shows the cluster takes the next run. Every test ends by checking that nothing of its runs is
left: no node process, no placement group that is not removed, no run held by the kernel's hub
and no other actor alive.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import notebook_kit
from notebook_kit import WorkerPool, notebook_launcher
from notebook_kit.errors import WorkerError
from tests.optional import needs
from tests.processes import marked_node_processes
from tests.test_preemption_integration import _until_told

pytestmark = [pytest.mark.integration, needs("ray", what="runs on a Ray cluster")]

# Marks the environment of this module's Ray workers (and so of their node processes), so a
# check for leftovers counts only this module's, whatever else runs on the machine.
_MARK, _TOKEN = "NK_RAY_TEST_RUN", secrets.token_hex(8)
NODE_DEATH_BOUND_S = 20.0  # a node's Ray worker process SIGKILLed: "node 1 lost"
_OBJECT_STORE_BYTES = 100 << 20  # the runs pass a few small objects


@pytest.fixture(scope="module", autouse=True)
def ray_runtime():
    """One local Ray instance for the module, made as cheap to start as Ray allows: no
    dashboard, no usage report, a small object store, and no idle workers started ahead."""
    import ray

    from notebook_kit.launch.cluster.engines import ray_actors

    # A kernel has one Ray connection; this test process had others before (the Ray client
    # module's head): the hub and keepers it made there are not this instance's.
    ray_actors._actors.clear()
    ray_actors._deaths.clear()
    quiet = {_MARK: _TOKEN, "RAY_USAGE_STATS_ENABLED": "0"}
    # As in a kernel that made a Dask LocalCluster before starting Ray: its nannies set this
    # in the kernel's own environment, which every Ray process then inherits.
    quiet["MALLOC_TRIM_THRESHOLD_"] = "65536"
    saved = {name: os.environ.get(name) for name in quiet}
    os.environ.update(quiet)  # the local Ray instance, and so its workers, inherit them
    try:
        ray.init(
            # A new local instance: with no address, ray.init joins any Ray instance running on
            # the machine (a head another module started and is still stopping, say), which
            # then refuses num_cpus.
            address="local",
            num_cpus=4,  # four places: two nodes, and a restart's two beside them
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=_OBJECT_STORE_BYTES,
            _system_config={"enable_worker_prestart": False},
        )
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    try:
        yield ray
    finally:
        ray.shutdown()


def node_processes() -> list[int]:
    """This module's node processes."""
    return marked_node_processes(_MARK, _TOKEN)


_KILLED_HERE: set[int] = set()  # processes of actors a test killed on purpose


def _actors_left() -> list[str]:
    """Every notebook_kit actor alive but the kernel's hub and keeper, every run the hub
    holds, and a hub or keeper that ended (the kernel makes each once and keeps it)."""
    import ray
    from ray._private import state

    job = ray.get_runtime_context().get_job_id()
    hub = f"notebook_kit-hub-{job}"
    alive = [
        str(actor["Name"])
        for actor in state.actors().values()
        if "notebook_kit" in str(actor.get("Name")) and actor.get("State") != "DEAD"
    ]
    ended = [
        f"an ended {actor['Name']}"
        for actor in state.actors().values()
        if "notebook_kit" in str(actor.get("Name"))
        and actor.get("State") == "DEAD"
        and actor.get("Pid") not in _KILLED_HERE
    ]
    runs = ray.get(ray.get_actor(hub).runs.remote(), timeout=30) if hub in alive else []
    keeper = f"notebook_kit-keeper-{job}-{ray.get_runtime_context().get_node_id()}"
    keepers = [name for name in alive if name.startswith(keeper)]
    kept = {hub, *keepers[:1]}  # one keeper at most: it is made again only once one died
    return [name for name in alive if name not in kept] + [f"run {run}" for run in runs] + ended


def _groups_left() -> list[str]:
    from ray.util import placement_group_table

    return [g for g, row in placement_group_table().items() if row["state"] != "REMOVED"]


def assert_nothing_left(within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while True:
        left = {"node processes": node_processes(), "groups": _groups_left()}
        left["actors and runs"] = _actors_left()
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not any(left.values()), f"left on the Ray cluster: {left}"


def test_all_reduce_metrics_result_and_weights_come_home():
    model = torch.nn.Linear(3, 1)
    name = "MALLOC_TRIM_THRESHOLD_"

    def train(model):
        import psutil

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
        zygote = psutil.Process(os.getppid()).parent().parent()  # guardian, node process
        trim = {os.environ.get(name), zygote.environ().get(name)}
        return {"sum": total.item(), "world": dist.get_world_size(), "rank": os.environ["RANK"],
                "trim": trim}  # fmt: skip

    result = notebook_launcher(
        train, args=(model,), num_processes=1, num_nodes=2, cluster="ray", live=False
    )
    # The nanny's malloc setting (twice the CPU a step) reached neither the rank nor the
    # zygote whose memory it shares.
    assert result == {"sum": 3.0, "world": 2, "rank": "0", "trim": {None}}
    assert torch.equal(model.weight, torch.full_like(model.weight, 7.0))
    record = notebook_kit.last_run()
    assert record is not None
    assert record.metrics["loss"] == [(0, 1.5), (1, 2.5), (2, 3.5)]  # mean over both nodes
    assert_nothing_left()


class _Recorder:
    """An observer that keeps everything and presses Stop once both ranks logged step 2."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self.steps: dict[int, int] = {}
        self.info = None
        self.summary = None

    def on_start(self, info):
        self.info = info

    def on_output(self, rank, stream, line):
        self.lines.append((rank, line))

    def on_metrics(self, batch):
        for _, step, _ in batch.records:
            self.steps[batch.rank] = max(self.steps.get(batch.rank, -1), int(step or 0))
        if min(self.steps.get(r, -1) for r in (0, 1)) >= 2:
            self.info.stop_flag.set()

    def on_tick(self):
        pass

    def on_finish(self, summary):
        self.summary = summary


def _train_until_stopped(limit: int = 100_000):
    from notebook_kit.runtime.context import current_launch
    from notebook_kit.runtime.messages import MetricsBatch

    step = 0
    while step < limit and not notebook_kit.should_stop():
        dist.all_reduce(torch.ones(1))
        rank = dist.get_rank()
        current_launch().send(MetricsBatch(rank, ((rank, step, {}),), None, None))
        time.sleep(0.01)
        step += 1
    steps = [None, None]
    dist.all_gather_object(steps, step)
    print(f"stopped at {step}")
    return steps


def _node_zygotes() -> list[int]:
    """Every rank's zygote (rank -> guardian -> node process -> zygote), gathered."""
    import psutil

    zygote = psutil.Process(os.getppid()).parent().ppid()
    gathered: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, zygote)
    return gathered


def test_the_next_launch_forks_its_nodes_from_the_ray_nodes_keeper():
    """The kernel's keeper actor holds its Ray node's zygote between runs, when Ray has
    ended the node tasks' worker processes: torch is imported once."""
    import psutil

    options = {"cluster": "ray", "num_nodes": 2, "num_processes": 1, "live": False}
    first = notebook_launcher(_node_zygotes, **options)
    second = notebook_launcher(_node_zygotes, **options)
    assert first == second and len(set(first)) == 1  # one Ray node: one keeper
    keeper = psutil.Process(first[0]).parent()
    assert " ".join(keeper.cmdline()).strip() == "ray::NodeKeeper"
    assert_nothing_left()
    _KILLED_HERE.add(keeper.pid)
    keeper.kill()  # its zygote ends with it; the next launch makes another keeper
    assert psutil.wait_procs([psutil.Process(first[0])], timeout=10)[0]
    third = notebook_launcher(_node_zygotes, **options)
    assert len(set(third)) == 1 and third[0] != first[0]
    assert_nothing_left()


def test_a_nodes_control_read_waits_in_the_hub_actor_while_the_kernel_publishes():
    """Through Ray: the hub serves the kernel's publishes while a node's control read waits
    in it, and answers that read when Stop arrives, not at a lease tick."""
    import ray

    from notebook_kit.node.links import ray as ray_task
    from notebook_kit.node.protocol import Control, control_frame

    def control(lease: int, stop: bool = False) -> bytes:
        return control_frame(Control(lease, stop, ""))

    hub = ray.remote(ray_task.RunHub).options(num_cpus=0).remote()
    try:
        ray.get(hub.set_control.remote("run", control(1)), timeout=30)
        link = ray_task.RayNodeLink(hub, "run", 0, "w0", zygote="")
        assert link.control(patience=60.0).lease == 1  # nothing known yet: at once
        read: list = []
        asking = threading.Thread(target=lambda: read.append(link.control(patience=60.0)))
        asking.start()
        ray.get(hub.set_control.remote("run", control(2)), timeout=30)  # served meanwhile
        asking.join(0.5)
        assert asking.is_alive()  # a lease tick alone: still waiting
        ray.get(hub.set_control.remote("run", control(3, stop=True)), timeout=30)
        asking.join(30)
        assert not asking.is_alive() and read[0].stop and read[0].lease == 3
        ray.get(hub.forget.remote("run"), timeout=30)
        with pytest.raises(LookupError, match="holds no run run"):  # forgotten: as unreachable
            link.control(patience=60.0)
    finally:
        ray.kill(hub)


def test_stop_ends_every_node_at_the_same_step_and_the_banner_names_ray_workers():
    recorder = _Recorder()
    steps = notebook_launcher(
        _train_until_stopped, num_processes=1, num_nodes=2, cluster="ray", observer=recorder,
        timeout=90,
    )  # fmt: skip
    assert steps[0] == steps[1] < 100_000
    assert recorder.summary.stopped
    assert {rank for rank, line in recorder.lines if line.startswith("stopped at")} == {0, 1}
    assert recorder.info.node_of() == {0: 0, 1: 1}
    assert "on each of 2 Ray workers (" in recorder.info.banner
    assert_nothing_left()


def _train_once_killed(starts: str) -> int:
    """Node 1 waits to be killed on the first attempt; the second attempt returns."""
    attempt = int(os.environ["NOTEBOOK_KIT_RESTART_COUNT"])
    with open(starts, "a") as file:
        file.write(f"{attempt}-{dist.get_rank()} {os.getpid()}\n")
    if attempt == 0:
        time.sleep(120)  # no collective: only the kernel can end node 0 in time
    total = torch.ones(1)
    dist.all_reduce(total)
    return int(total.item()) + 10 * attempt


def _task_process(name: str) -> int:
    """The pid of the Ray worker process running the task ``name`` now (Ray titles it so)."""
    import psutil

    running = [
        process.info["pid"]
        for process in psutil.process_iter(["pid", "cmdline"])
        if " ".join(process.info["cmdline"] or ()).strip() == f"ray::{name}"
    ]
    assert len(running) == 1, running
    return running[0]


def _kill_node_1_once_started(starts: Path) -> dict[str, float]:
    """SIGKILL the Ray worker process running node 1's task once both ranks have started."""

    killed: dict[str, float] = {}

    def kill() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            lines = starts.read_text().split("\n") if starts.exists() else []
            rank_1 = [line.split()[1] for line in lines if line.startswith("0-1 ")]
            if rank_1 and len([line for line in lines if line.startswith("0-")]) == 2:
                os.kill(_task_process("notebook_kit node 1"), signal.SIGKILL)
                killed["at"] = time.monotonic()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    killed["thread"] = thread  # type: ignore[assignment]
    return killed


def _started(starts: Path) -> list[str]:
    """``attempt-rank`` of every rank that started, sorted."""
    return sorted(line.split()[0] for line in starts.read_text().split("\n") if line)


def _ray_node_ids(alive: bool) -> set[str]:
    import ray

    return {str(node["NodeID"]) for node in ray.nodes() if bool(node.get("Alive")) == alive}


def _until(condition, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "the Ray cluster did not change in time"
        time.sleep(0.2)


def test_a_ray_node_that_left_offers_no_places_to_a_restart():
    """A second Ray node joins, then leaves (its raylet stopped); Ray still lists it, dead,
    and a restart's choice of workers must not count its places (the engine remembers every
    place it has seen, for the names of those whose process died)."""
    import subprocess
    import sys

    import ray

    from notebook_kit.launch.cluster.engines.ray import RayEngine

    before = _ray_node_ids(alive=True)
    ray_cli = Path(sys.executable).with_name("ray")
    address = ray.get_runtime_context().gcs_address
    joined = subprocess.Popen(
        [str(ray_cli), "start", f"--address={address}", "--num-cpus=1", "--block",
         "--object-store-memory=80000000", "--disable-usage-stats"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _until(lambda: _ray_node_ids(alive=True) - before)
        (new,) = _ray_node_ids(alive=True) - before
        engine = RayEngine()
        theirs = {name for name in engine.present() if new[:8] in name}
        assert theirs, "the new Ray node's place is offered while it is alive"
    finally:
        joined.terminate()  # ray start --block stops the node's raylet and its processes
        joined.wait(timeout=60)
    _until(lambda: new in _ray_node_ids(alive=False))
    assert not engine.present() & theirs
    assert not set(engine.choose(None, 1)) & theirs
    assert_nothing_left()


def test_a_killed_node_is_node_lost_and_max_restarts_trains_again(tmp_path, capsys):
    starts = tmp_path / "starts"
    killed = _kill_node_1_once_started(starts)
    with pytest.raises(WorkerError, match="node 1 lost: its Ray worker process died") as caught:
        notebook_launcher(
            _train_once_killed, args=(str(starts),), num_processes=1, num_nodes=2,
            cluster="ray", live=False,
        )  # fmt: skip
    ended = time.monotonic()
    killed["thread"].join()
    assert ended - killed["at"] < NODE_DEATH_BOUND_S
    error = caught.value
    assert error.lost_nodes == (1,)  # node 0 was ended, not lost
    assert error.rank == 1  # the lost node's first rank
    heading = f"Rank 1 (node 1, Ray worker {error.nodes[1]}) of 2 failed: node 1 lost"
    assert heading in str(error), str(error)
    time.sleep(1.0)
    assert _started(starts) == ["0-0", "0-1"]  # nobody trained twice
    assert_nothing_left()

    starts.unlink()
    killed = _kill_node_1_once_started(starts)
    result = notebook_launcher(
        _train_once_killed, args=(str(starts),), num_processes=1, num_nodes=2, cluster="ray",
        max_restarts=1, live=False,
    )  # fmt: skip
    killed["thread"].join()
    assert result == 12  # two ranks, on the restart
    out = capsys.readouterr().out
    assert "node 1 lost: its Ray worker process died" in out, out
    assert "restarting all 2 nodes (restart 1 of 1)" in out, out
    assert _started(starts) == ["0-0", "0-1", "1-0", "1-1"]
    assert_nothing_left()


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


def test_a_ray_pool_keeps_its_ranks_between_cells_and_leaves_nothing():
    space = {"__name__": "__main__"}
    exec(_CELL, space)
    # timeout: a command the nodes never hear fails the test instead of waiting for ever
    pool = WorkerPool(cluster="ray", num_nodes=2, num_processes=1, live=False, timeout=20)
    try:
        ranks = pool.pids
        assert len(ranks) == 2 and set(ranks) <= set(
            p for node in node_processes() for p in (node, *_children(node))
        )
        assert pool.run(space["keep"], "first") == 0
        assert pool.run(space["kept"], ranks="all") == [
            ("first", 0, ranks[0]), ("first", 1, ranks[1]),
        ]  # fmt: skip
        pool.push(x=1)
        assert pool.run_cell("x + 1") == 2 and pool.pull("x", rank=1) == 1
    finally:
        pool.close()
    assert_nothing_left()


def _children(pid: int) -> list[int]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    return []


def test_sigterm_to_a_ray_worker_lets_its_node_save_then_ends_the_worker(tmp_path):
    """A Ray node draining, or its pod deleted, SIGTERMs the Ray worker running node 1's
    task: every rank stops at one step with the reason and saves, then the worker ends."""
    import psutil

    marks = tmp_path / "marks"
    marks.mkdir()
    sent: dict[str, int] = {}

    def preempt() -> None:
        deadline = time.monotonic() + 90
        while not all((marks / f"rank-{r}").exists() for r in (0, 1)):
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        time.sleep(0.3)  # mid-run
        sent["worker"] = _task_process("notebook_kit node 1")
        os.kill(sent["worker"], signal.SIGTERM)

    sender = threading.Thread(target=preempt, daemon=True)
    sender.start()
    step, reason = notebook_launcher(
        _until_told, args=(str(tmp_path / "project"), str(marks)), num_processes=1,
        num_nodes=2, cluster="ray", live=False, timeout=35,  # bounded if the worker just dies
    )  # fmt: skip
    sender.join()
    assert (marks / "stopped-0").read_text() == (marks / "stopped-1").read_text() == str(step)
    assert reason.startswith("node 1 received SIGTERM"), reason
    assert (tmp_path / "project" / "checkpoints" / "checkpoint_0" / "checkpoint.json").exists()
    deadline = time.monotonic() + 30  # and then the worker ends, as SIGTERM asked
    while psutil.pid_exists(sent["worker"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not psutil.pid_exists(sent["worker"])
    assert_nothing_left()


def _wait_for_file(path: str) -> int:
    deadline = time.monotonic() + 150
    while not Path(path).exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return 7


def test_a_forged_event_through_the_hub_actor_runs_nothing_and_the_launch_returns(tmp_path):
    """A third Ray driver finds the kernel's hub by name and posts pickles for the run."""
    import subprocess
    import sys
    import warnings

    import ray

    marker, done = tmp_path / "ran-in-the-kernel", tmp_path / "attack-done"
    posted: list[str] = []
    address = ray.get_runtime_context().gcs_address

    def third_party() -> None:
        try:
            attacker = [sys.executable, "-m", "tests.cluster_attacker", "ray", address]
            ran = subprocess.run(
                [*attacker, str(marker)], capture_output=True, text=True, timeout=150
            )
            assert ran.returncode == 0, ran.stderr[-3000:]
            posted.extend(ran.stdout.split())
        finally:
            done.touch()

    thread = threading.Thread(target=third_party, daemon=True)
    thread.start()
    options = {"cluster": "ray", "num_nodes": 2, "num_processes": 1, "live": False}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert notebook_launcher(_wait_for_file, args=(str(done),), **options) == 7
    thread.join(timeout=10)
    assert not marker.exists()
    (run,) = posted
    named = [str(w.message) for w in caught if f"notebook_kit-{run}-events" in str(w.message)]
    assert len(named) == 1, [str(w.message) for w in caught]
    assert_nothing_left()
