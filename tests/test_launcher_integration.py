"""notebook_launcher with real forked workers and real gloo process groups."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist
from torch import nn

from notebook_kit import (
    ForkSafetyError,
    LaunchConfig,
    PortInUseError,
    WorkerError,
    notebook_launcher,
)
from notebook_kit.live.headless import QuietObserver
from notebook_kit.runtime.context import current_launch

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


def _describe_worker() -> dict:
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    total = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(total)
    return {
        "env": {name: os.environ.get(name) for name in names},
        "initialized": dist.is_initialized(),
        "backend": dist.get_backend(),
        "sum": int(total.item()),
        "pid": os.getpid(),
        "threads": torch.get_num_threads(),
    }


def test_workers_get_environment_and_process_group(capsys):
    result = notebook_launcher(_describe_worker, num_processes=2)
    assert result["initialized"] and result["backend"] == "gloo"
    assert result["sum"] == 3  # both ranks took part in the all_reduce
    assert result["env"]["RANK"] == "0" and result["env"]["WORLD_SIZE"] == "2"
    assert result["env"]["LOCAL_WORLD_SIZE"] == "2" and result["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert int(result["env"]["MASTER_PORT"]) > 0
    assert result["pid"] != os.getpid()
    assert "Launching 2 processes on CPU (gloo)" in capsys.readouterr().out
    assert not dist.is_initialized()
    assert "MASTER_PORT" not in os.environ  # never pinned in the kernel


def test_every_rank_sees_its_own_rank():
    def ranks():
        gathered = [None, None]
        dist.all_gather_object(gathered, (os.environ["RANK"], os.environ["LOCAL_RANK"]))
        return gathered

    assert notebook_launcher(ranks, num_processes=2) == [("0", "0"), ("1", "1")]


def _frozen_and_tracked() -> tuple[int, int]:
    import gc

    return gc.get_freeze_count(), len(gc.get_objects())


def test_workers_garbage_collection_leaves_the_kernels_objects_alone():
    """What a worker inherits is frozen, so its collections never walk (and copy) it."""
    import gc

    kernel_objects = len(gc.get_objects())
    frozen, tracked = notebook_launcher(_frozen_and_tracked, num_processes=2, live=False)
    assert frozen > kernel_objects // 2, (frozen, kernel_objects)
    assert tracked < frozen // 2, (tracked, frozen)
    assert gc.get_freeze_count() == 0  # the kernel's own collector is as it was


def test_one_process_runs_in_the_caller():
    result = notebook_launcher(_describe_worker, num_processes=1)
    assert result["pid"] == os.getpid()
    assert result["env"]["WORLD_SIZE"] == "1" and result["sum"] == 1
    assert not dist.is_initialized()
    assert "RANK" not in os.environ


def test_one_process_raises_the_original_exception():
    def broken():
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        notebook_launcher(broken, num_processes=1)


def test_closures_and_lambdas_are_never_pickled():
    lock = threading.Lock()  # unpicklable, captured by the closure

    def uses_lock():
        with lock:
            return dist.get_world_size()

    assert notebook_launcher(uses_lock, num_processes=2) == 2
    assert notebook_launcher(lambda a, b=0: a + b, args=(2,), kwargs={"b": 3}, num_processes=2) == 5


def test_large_state_dict_comes_back():
    def make_weights():
        torch.manual_seed(0)
        return nn.Linear(3200, 4096).state_dict()  # ~50 MB of float32

    state = notebook_launcher(make_weights, num_processes=2)
    torch.manual_seed(0)
    expected = nn.Linear(3200, 4096).state_dict()
    assert sum(t.numel() * 4 for t in state.values()) > 50e6
    assert torch.equal(state["weight"], expected["weight"])


def test_unpicklable_result_names_rank_and_type():
    with pytest.raises(WorkerError, match=r"rank 0 returned a value of type _thread\.lock"):
        notebook_launcher(lambda: threading.Lock(), num_processes=2)


def _fail_on_rank_one():
    if dist.get_rank() == 1:
        raise ValueError("bad batch on rank one")
    dist.barrier()  # rank 0 waits in a collective rank 1 never joins


def test_raising_rank_is_reported_with_traceback():
    with pytest.raises(WorkerError) as caught:
        notebook_launcher(_fail_on_rank_one, num_processes=2)
    # docs/guarantees.md: a fraction of a second from the raise (the rank's own clock;
    # CLOCK_MONOTONIC is one clock for every process) to the exception in the caller.
    assert time.monotonic() - caught.value.failures[0].time < 1.0
    error = caught.value
    assert isinstance(error, RuntimeError) and error.rank == 1
    message = str(error)
    assert message.startswith("Rank 1 of 2 failed: ValueError: bad batch on rank one")
    assert "Traceback of rank 1" in message and "_fail_on_rank_one" in message
    assert 'raise ValueError("bad batch on rank one")' in message


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("exit", "exited with code 3"),
        ("kill", "died from SIGKILL (9)"),
    ],
)
def test_rank_dying_without_exception_while_others_wait(how, expected, tmp_path):
    died = tmp_path / "died"

    def die():
        if dist.get_rank() == 1:
            died.write_text(repr(time.monotonic()))
            if how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(1))

    with pytest.raises(WorkerError) as caught:
        notebook_launcher(die, num_processes=2)
    assert time.monotonic() - float(died.read_text()) < 1.0  # "within a fraction of a second"
    assert caught.value.rank == 1
    assert expected in str(caught.value)


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("sys.exit", "Rank 1 of 2 failed: called sys.exit(0) while rank 0 still needed it"),
        ("return", "Rank 1 of 2 failed: returned while rank 0 still needed it"),
    ],
)
def test_rank_leaving_early_is_blamed_not_the_rank_waiting_for_it(how, expected):
    def leave_early():
        if dist.get_rank() == 1:
            if how == "sys.exit":
                sys.exit(0)
            return None
        dist.all_reduce(torch.ones(1))  # rank 1 never joins: rank 0 loses its peer
        return "unreachable"

    for _ in range(3):
        with pytest.raises(WorkerError) as caught:
            notebook_launcher(leave_early, num_processes=2, rendezvous_timeout=10)
        assert caught.value.rank == 1, str(caught.value)
        assert str(caught.value).startswith(expected)


class _StartTime(QuietObserver):
    """Notes when the workers are forked: the timeout counts from there, not from the call
    (the checks and the fork before it take seconds on a loaded machine)."""

    started: float | None = None

    def on_start(self, info: object) -> None:
        super().on_start(info)
        self.started = time.monotonic()


def test_timeout_stops_a_hanging_run():
    observer = _StartTime()
    with pytest.raises(TimeoutError, match=r"timeout=0\.5"):
        notebook_launcher(lambda: time.sleep(3600), num_processes=2, timeout=0.5, observer=observer)
    assert observer.started is not None
    # The timeout ended the run, not the function: far sooner than its hour, however loaded
    # the machine (how soon workers stop once told is test_interrupt_of_the_caller_...'s).
    assert time.monotonic() - observer.started < 60


def _child_pids() -> set[int]:
    return {child.pid for child in psutil.Process().children()}


def test_interrupt_of_the_caller_stops_workers_and_restores_handlers():
    handler_before = signal.getsignal(signal.SIGINT)
    children_before = _child_pids()
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(lambda: time.sleep(60), num_processes=2)
    assert time.monotonic() - started < 0.5 + 2.0  # docs/guarantees.md: stopped within 2 s
    assert _child_pids() <= children_before
    assert signal.getsignal(signal.SIGINT) is handler_before
    assert notebook_launcher(lambda: dist.get_world_size(), num_processes=2) == 2


def test_busy_port_fails_before_forking(tmp_path):
    marker = tmp_path / "ran"
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"Port {port}.*Leave use_port unset"):
            notebook_launcher(marker.touch, num_processes=2, use_port=port)
    assert not marker.exists()


def test_explicit_free_port_is_used():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    assert notebook_launcher(lambda: os.environ["MASTER_PORT"], num_processes=2, use_port=port) == (
        str(port)
    )


def test_rendezvous_listens_on_loopback_only():
    def listening_addresses():
        connections = psutil.Process().net_connections(kind="tcp")
        return sorted({c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN})

    addresses = notebook_launcher(listening_addresses, num_processes=2)
    assert addresses and all(ip.startswith("127.") for ip in addresses)


def test_twenty_launches_leak_nothing():
    process = psutil.Process()
    notebook_launcher(lambda: None, num_processes=2)  # warm-up: lazily created objects
    fds, threads, children = process.num_fds(), process.num_threads(), _child_pids()
    for _ in range(20):
        assert notebook_launcher(lambda: dist.get_rank(), num_processes=2) == 0
    assert process.num_fds() <= fds
    assert process.num_threads() <= threads
    assert _child_pids() <= children


def test_existing_process_group_in_kernel_is_refused_when_fork_is_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTEBOOK_KIT_START_METHOD", "fork")  # "auto" starts from the template
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ForkSafetyError, match=r"destroy_process_group.*'auto' the workers"):
            notebook_launcher((tmp_path / "ran").touch, num_processes=2)
    finally:
        dist.destroy_process_group()
    assert not (tmp_path / "ran").exists()


def test_cuda_seen_as_initialised_by_the_fork_probe_is_refused(monkeypatch):
    from notebook_kit.config import environment
    from notebook_kit.launch import preflight

    # The probe really forks; only the driver's answer in the child is simulated (no GPU
    # here): CUDA_ERROR_NOT_INITIALIZED, as after a context made in the parent.
    monkeypatch.setattr(preflight, "_cuda_compiled", lambda: True)
    monkeypatch.setattr(environment, "_cuda_compiled", lambda: True)
    monkeypatch.setattr(environment, "_driver_init_status", lambda: 3)
    monkeypatch.setenv("NOTEBOOK_KIT_START_METHOD", "fork")  # "auto" starts from the template
    with pytest.raises(ForkSafetyError, match="Restart the kernel"):
        notebook_launcher(lambda: None, num_processes=2)


def test_launch_context_of_the_kernel_does_not_leak_into_workers():
    def context_rank():
        return (current_launch().rank, current_launch().world_size)

    # Run from inside a one-process launch, whose context is active in the caller.
    def outer():
        assert current_launch().world_size == 1
        return notebook_launcher(context_rank, num_processes=2)

    with pytest.raises(ForkSafetyError):  # the one-process group is live in the caller
        notebook_launcher(outer, num_processes=1)
    assert notebook_launcher(context_rank, num_processes=2) == (0, 2)


def test_threads_are_split_between_workers():
    cores = len(os.sched_getaffinity(0))
    assert notebook_launcher(torch.get_num_threads, num_processes=2) == max(1, cores // 2)
    assert notebook_launcher(torch.get_num_threads, num_processes=2, threads_per_process=3) == 3


def test_output_is_prefixed_whole_lines(capsys):
    logger = logging.getLogger("notebook_kit.tests.chatty")
    handler = logging.StreamHandler(sys.stderr)  # made in the kernel, before the fork
    logger.addHandler(handler)

    def chatty():
        rank = dist.get_rank()
        for index in range(200):
            print(f"line {index} from rank {rank} " + "x" * 50)
        logger.warning("a warning from rank %d", rank)
        print(f"careful on rank {rank}", file=sys.stderr)

    try:
        notebook_launcher(chatty, num_processes=2)
    finally:
        logger.removeHandler(handler)
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if line.startswith("[rank")]
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank {rank}] ")]
        assert mine == [f"[rank {rank}] line {i} from rank {rank} " + "x" * 50 for i in range(200)]
    assert "[rank 1] " in captured.err and "careful on rank 1" in captured.err
    assert "a warning from rank 0" in captured.err


def test_output_survives_a_crash_right_after_printing(capsys):
    def crash():
        print("last words", flush=False)
        print("no newline at the end", end="")
        dist.barrier()  # both ranks have printed before either dies
        os._exit(7)

    with pytest.raises(WorkerError, match="exited with code 7"):
        notebook_launcher(crash, num_processes=2)
    out = capsys.readouterr().out
    for rank in (0, 1):
        assert f"[rank {rank}] last words" in out
        assert f"[rank {rank}] no newline at the end" in out


def test_workers_with_grandchildren_leave_nothing_behind():
    import subprocess

    def spawn_grandchild():
        subprocess.Popen(["sleep", "60"])
        raise RuntimeError("leaving a sleeping grandchild")

    with pytest.raises(WorkerError, match="leaving a sleeping grandchild"):
        notebook_launcher(spawn_grandchild, num_processes=2)


def _train_then(net: nn.Module, ending: str, ready: str | None = None) -> str:
    """Train ``net`` one step on every rank, then rank 0 returns (sending its weights home)
    while rank 1 ends as ``ending`` says: "return", "raise" or "hang"."""
    from notebook_kit import Accelerator

    accelerator = Accelerator()
    model = accelerator.prepare(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    accelerator.backward(model(torch.ones(4, 2)).pow(2).sum())
    optimizer.step()
    dist.barrier()  # both ranks trained
    if dist.get_rank() == 0 or ending == "return":
        if ready is not None:
            open(ready, "w").close()  # rank 0's weights are on their way home
        return "trained"
    time.sleep(0.5)  # rank 0's result (and weights) reach the kernel first
    if ending == "raise":
        raise RuntimeError("failed after training")
    time.sleep(60)
    return "never"


def test_weights_of_kernel_models_are_untouched_by_failed_runs():
    model = nn.Linear(2, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(WorkerError, match="failed after training"):
        notebook_launcher(_train_then, args=(model, "raise"), num_processes=2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # The same run without the failure does change the model: the check above could fail.
    assert notebook_launcher(_train_then, args=(model, "return"), num_processes=2) == "trained"
    assert not torch.equal(before["weight"], model.weight)


def test_weights_of_kernel_models_are_untouched_by_an_interrupted_run(tmp_path):
    model = nn.Linear(2, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ready = tmp_path / "rank0-returned"

    def interrupt_once_rank_0_returned():
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # its result and weights have been read by the kernel
        os.kill(os.getpid(), signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_once_rank_0_returned, daemon=True)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(_train_then, args=(model, "hang", str(ready)), num_processes=2)
    interrupter.join()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_failed_workers_are_restarted_up_to_max_restarts(capsys):
    def flaky():
        context = current_launch()
        if context.restart_count < 2 and context.rank == 1:
            raise RuntimeError(f"flaky on attempt {context.restart_count}")
        return context.restart_count, os.environ["NOTEBOOK_KIT_RESTART_COUNT"]

    assert notebook_launcher(flaky, num_processes=2, max_restarts=2) == (2, "2")
    out = capsys.readouterr().out
    assert "Rank 1 failed (RuntimeError: flaky on attempt 0); restarting all workers" in out
    assert "(restart 2 of 2)" in out
    with pytest.raises(WorkerError, match="flaky on attempt 1"):
        notebook_launcher(flaky, num_processes=2, max_restarts=1)


def test_explicit_arguments_beat_the_config_which_beats_the_saved_default(isolated_saved_config):
    def settings():
        return dist.get_world_size(), os.environ["NOTEBOOK_KIT_MIXED_PRECISION"], torch.rand(1)

    LaunchConfig(num_processes=2, mixed_precision="bf16").save(isolated_saved_config)
    try:
        world, precision, _ = notebook_launcher(settings)  # nothing given: the saved default
        assert (world, precision) == (2, "bf16")
        config = LaunchConfig(num_processes=2, mixed_precision="fp16", seed=3)
        world, precision, first = notebook_launcher(settings, config=config)
        assert (world, precision) == (2, "fp16")  # the config replaces the saved default
        _, precision, second = notebook_launcher(settings, config=config, mixed_precision="no")
        assert precision == "no" and torch.equal(first, second)  # same seed, same draw
    finally:
        isolated_saved_config.unlink()


def test_workers_use_several_threads_after_the_kernel_used_its_thread_pool():
    big = torch.ones(1 << 24)
    with torch.inference_mode():
        big.sum()  # starts the kernel's OpenMP pool, whose threads a forked child lacks

    def parallel_sum():
        return float(big.sum()), torch.get_num_threads()

    result = notebook_launcher(parallel_sum, num_processes=2, threads_per_process=2, timeout=60)
    assert result == (float(1 << 24), 2)
