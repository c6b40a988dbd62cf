"""WorkerPool with real forked workers, from plain Python: runs, names, faults, interrupts."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
import torch

from notebook_kit import LaunchConfig, WorkerError, WorkerPool, last_run
from notebook_kit.launch.pool.shipping import SendTooLargeError

pytestmark = [pytest.mark.integration]

SETUP = "import os, time, torch, torch.distributed as dist\nrank = dist.get_rank()"


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    shared = WorkerPool(num_processes=2, live=False)
    shared.run_cell(SETUP)
    yield shared
    shared.close()


@pytest.fixture
def own_pool() -> Iterator[WorkerPool]:
    """A pool for one test that breaks it; closed at the end, leaving no process."""
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    fresh = WorkerPool(num_processes=2, live=False)
    fresh.run_cell(SETUP)
    yield fresh
    fresh.close()
    left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    assert not [c for c in left if c.status() != psutil.STATUS_ZOMBIE], left


def _rank_and_scale(scale: float) -> float:
    import torch.distributed as dist

    total = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(total)
    return total.item() * scale


def _interrupt_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_run_returns_rank_zeros_value_or_every_ranks(pool: WorkerPool) -> None:
    assert pool.run(_rank_and_scale, 10) == 30.0
    assert pool.run(_rank_and_scale, scale=2, ranks="all") == [6.0, 6.0]
    assert pool.run(lambda: os.getpid(), ranks="all") == pool.pids


def test_cells_keep_their_names_and_return_the_last_expression(pool: WorkerPool) -> None:
    assert pool.run_cell("counter = rank * 100\ncounter") == 0
    assert pool.run_cell("counter += 1\ncounter") == 1
    assert pool.run_cell("counter;") is None  # a trailing semicolon hides the value
    assert pool.pull("counter", rank=1) == 101


def test_push_and_pull_move_values_and_tensors_arrive_on_the_cpu(pool: WorkerPool) -> None:
    pool.push(offset=5, weights=torch.arange(4.0))
    assert pool.run_cell("float(weights.sum()) + offset + rank") == 11.0
    pulled = pool.pull("weights", rank=1)
    assert torch.equal(pulled, torch.arange(4.0)) and pulled.device.type == "cpu"


def test_functions_and_classes_defined_after_the_start_reach_the_workers(pool: WorkerPool) -> None:
    namespace = sys.modules["__main__"].__dict__
    code = (
        "factor = 3\n"
        "class Scaler:\n"
        "    def apply(self, value):\n"
        "        return value * factor\n"
        "def scaled(value):\n"
        "    return Scaler().apply(value) + rank\n"
    )
    exec(code, namespace)  # as a kernel cell would, after the pool started
    try:
        assert pool.run(namespace["scaled"], 2, ranks="all") == [6, 7]
        assert pool.run_cell("scaled(1)") == 3
        namespace["factor"] = 10  # the kernel's newer value is sent again
        assert pool.run_cell("scaled(1)") == 10
    finally:
        for name in ("factor", "Scaler", "scaled"):
            namespace.pop(name, None)


def test_a_large_value_is_refused_with_a_hint_to_push_it(pool: WorkerPool) -> None:
    namespace = sys.modules["__main__"].__dict__
    namespace["huge"] = torch.zeros(80 << 20, dtype=torch.uint8)  # over the 64 MiB limit
    exec("def size():\n    return huge.numel()\n", namespace)
    try:
        with pytest.raises(SendTooLargeError, match=r"pool\.push\(huge=huge\)"):
            pool.run(namespace["size"])
        pool.push(huge=namespace["huge"])  # sent once ...
        assert pool.run(namespace["size"]) == 80 << 20  # ... then found by name, not copied
    finally:
        namespace.pop("huge", None)
        namespace.pop("size", None)
        pool.run_cell("del huge")


def test_bad_settings_fail_before_any_fork() -> None:
    before = len(psutil.Process().children(recursive=True))
    with pytest.raises(ValueError, match="num_processes must be >= 1"):
        WorkerPool(num_processes=0)
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        WorkerPool(num_processes=2, mixed_precision="fp8")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config must be a LaunchConfig"):
        WorkerPool(num_processes=2, config="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="runs on this node only"):
        WorkerPool(num_processes=2, num_nodes=2, master_addr="10.0.0.1", node_rank=0)
    with pytest.raises(ValueError, match=r"max_restarts=2: a WorkerPool never reruns.*restart\(\)"):
        WorkerPool(num_processes=2, max_restarts=2)
    with pytest.raises(ValueError, match="isolate=False: a WorkerPool always runs"):
        WorkerPool(num_processes=2, isolate=False)
    assert len(psutil.Process().children(recursive=True)) == before


def test_a_configs_launch_only_setting_is_left_to_launches() -> None:
    with WorkerPool(num_processes=1, max_restarts=0, config=LaunchConfig(max_restarts=3)) as pool:
        assert pool.run(lambda: 5) == 5


def test_an_error_on_every_rank_names_the_rank_and_keeps_the_workers(pool: WorkerPool) -> None:
    pids = pool.pids
    with pytest.raises(WorkerError) as raised:
        pool.run_cell("kept = 7\n1 / 0")
    message = str(raised.value)
    assert message.startswith("Rank 0 of 2 failed: ZeroDivisionError: division by zero")
    assert "Rank 1 failed the same way" in message and "still running" in message
    assert 'File "<distributed cell' in message and "1 / 0" in message
    assert pool.pids == pids and pool.run_cell("kept") == 7


def test_a_peer_failing_a_moment_after_the_first_is_named_too_not_interrupted(
    pool: WorkerPool,
) -> None:
    with pytest.raises(WorkerError) as raised:
        pool.run_cell("if rank == 1:\n    time.sleep(0.05)\n1 / 0")
    message = str(raised.value)
    assert message.startswith("Rank 0 of 2 failed: ZeroDivisionError"), message
    assert "Rank 1 failed the same way" in message, message


def test_an_error_while_a_peer_waits_in_a_collective_restarts_the_workers(
    own_pool: WorkerPool,
) -> None:
    pids = own_pool.pids
    with pytest.raises(WorkerError) as raised:
        own_pool.run_cell("if rank == 0:\n    raise ValueError('boom')\ndist.barrier()")
    assert raised.value.rank == 0 and "ValueError: boom" in str(raised.value)
    assert "workers were stopped" in str(raised.value) and "lost" in str(raised.value)
    assert own_pool.pids == []  # stopped at once, not left waiting in the collective
    assert own_pool.run(_rank_and_scale, 1) == 3.0  # the next run starts new workers
    assert set(own_pool.pids).isdisjoint(pids) and own_pool.restarts == 1


def test_a_dead_rank_is_reported_and_the_next_run_works(
    own_pool: WorkerPool, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(WorkerError, match=r"Rank 1 of 2 failed: exited with code 3"):
        own_pool.run_cell("if rank == 1:\n    os._exit(3)\ndist.barrier()")
    assert own_pool.run_cell("1") == 1  # new workers
    os.kill(own_pool.pids[1], signal.SIGKILL)  # a rank dies between runs (OOM killer, say)
    time.sleep(0.2)
    assert own_pool.run(_rank_and_scale, 1) == 3.0
    assert "Starting 2 new workers for the pool" in capsys.readouterr().out
    assert own_pool.restarts == 2


def test_interrupt_of_python_code_keeps_the_workers_and_their_names(pool: WorkerPool) -> None:
    pids = pool.pids
    pool.run_cell("survivor = 'still here'")
    _interrupt_after(0.5)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        pool.run_cell("while True:\n    survivor = 'still here'")
    assert time.monotonic() - started < 2.5  # 0.5 s before the interrupt, then within 2 s
    assert pool.pids == pids and pool.run_cell("survivor") == "still here"


def test_interrupt_of_blocked_code_stops_the_workers_within_two_seconds(
    own_pool: WorkerPool,
) -> None:
    pids = own_pool.pids
    _interrupt_after(0.5)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        own_pool.run_cell("time.sleep(60)")
    assert time.monotonic() - started < 2.5
    assert own_pool.pids == [] and not any(psutil.pid_exists(pid) for pid in pids)
    assert own_pool.run_cell("1 + 1") == 2


def test_timeout_interrupts_the_run_and_keeps_the_pool() -> None:
    with WorkerPool(num_processes=2, timeout=1.0, live=False) as timed:
        with pytest.raises(TimeoutError, match=r"timeout=1\.0"):
            timed.run_cell("while True:\n    pass")
        assert timed.run_cell("6 * 7") == 42


def test_weights_of_a_kernel_model_come_home_and_the_run_is_recorded(pool: WorkerPool) -> None:
    model = torch.nn.Linear(2, 1)
    torch.nn.init.zeros_(model.weight)

    def train(model: torch.nn.Module) -> int:
        from notebook_kit import Accelerator

        accelerator = Accelerator()
        prepared = accelerator.prepare(model)
        optimizer = torch.optim.SGD(prepared.parameters(), lr=0.1)
        for step in range(3):
            loss = prepared(torch.ones(4, 2)).sum()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.log({"loss": loss.item()}, step=step)
        return accelerator.process_index

    assert pool.run(train, model) == 0
    assert model.weight.abs().sum().item() > 0  # rank 0's trained weights, in this object
    record = last_run()
    assert record is not None and record.succeeded and len(record.metrics["loss"]) == 3


def test_twenty_runs_leave_no_descriptor_or_thread_behind(pool: WorkerPool) -> None:
    def counts() -> tuple[int, int]:
        return len(os.listdir("/proc/self/fd")), threading.active_count()

    pool.run_cell("1")
    kernel_before = counts()
    workers_before = pool.run(counts, ranks="all")
    for index in range(20):
        pool.run_cell(f"value = {index}")
    assert counts() == kernel_before
    assert pool.run(counts, ranks="all") == workers_before


def test_close_collection_and_exit_leave_no_worker() -> None:
    pool = WorkerPool(num_processes=2, live=False)
    pids = pool.pids
    pool.close()
    pool.close()  # twice is fine
    assert not any(psutil.pid_exists(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.run_cell("1")
    pool.restart()  # a closed pool starts new workers
    assert pool.run_cell("2") == 2 and set(pool.pids).isdisjoint(pids)
    pids = pool.pids
    pool.close()
    assert not any(psutil.pid_exists(pid) for pid in pids)
    collected = WorkerPool(num_processes=2, live=False)
    pids = collected.pids
    del collected
    gc.collect()
    assert not any(psutil.pid_exists(pid) for pid in pids)
    script = "from notebook_kit import WorkerPool\np = WorkerPool(num_processes=2)\nprint(p.pids)"
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pids = [int(pid) for pid in done.stdout.strip().strip("[]").split(",")]
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(psutil.pid_exists(pid) for pid in pids)


def test_a_group_left_out_of_step_is_found_and_the_workers_restarted(
    own_pool: WorkerPool,
) -> None:
    # Rank 0 leaves a collective pending that rank 1 never joins; both then raise (rank 1
    # waits first, so that rank 0's collective is pending before any rank is interrupted).
    cell = (
        "if rank == 0:\n"
        "    pending = dist.all_reduce(torch.ones(7), async_op=True)\n"
        "else:\n"
        "    time.sleep(0.5)\n"
        "raise ValueError('on both')"
    )
    with pytest.raises(WorkerError) as raised:
        own_pool.run_cell(cell)
    message = str(raised.value)
    # The rank whose error arrived first is named.
    assert re.match(r"Rank [01] of 2 failed: ValueError: on both", message), message
    assert "out of step" in message and own_pool.pids == []
    assert own_pool.run(_rank_and_scale, 1) == 3.0  # a fresh group, in step


def test_push_sends_the_value_again_even_when_the_workers_hold_it(pool: WorkerPool) -> None:
    values = torch.zeros(3)
    pool.push(values=values)
    values += 1  # changed in place in the kernel: the same object
    pool.push(values=values)
    assert pool.run_cell("values.tolist()") == [1.0, 1.0, 1.0]
