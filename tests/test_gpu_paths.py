"""The GPU paths' promises that the CPU can show: no sync in logging, fp16 skips with fused
optimizers, one check for both log calls, a fork probe that says why a run is on the CPU and
never hangs the kernel, nothing coming home or asked in the kernel that initialises CUDA.

Only what a GPU or its driver would answer is simulated; the probe really forks.

``tests/gpu/`` checks what only a GPU can show (no sync at all under
``torch.cuda.set_sync_debug_mode("error")``, side streams, NCCL pools).
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import notebook_kit
from notebook_kit import Accelerator, ForkSafetyError, LaunchConfig, notebook_launcher
from notebook_kit.accelerator.state import resolve_process_state
from notebook_kit.config import environment, forked_probe
from notebook_kit.config.environment import KernelState
from notebook_kit.launch import plan as plan_module
from notebook_kit.launch import preflight
from notebook_kit.launch.plan import make_plan
from notebook_kit.live.metrics import MetricsAggregator
from notebook_kit.runtime import metrics
from notebook_kit.runtime.context import LaunchContext, active_launch
from notebook_kit.runtime.messages import decode, encode
from notebook_kit.runtime.seeding import get_rng_states, set_rng_states
from notebook_kit.worker.host_pickling import dumps_for_kernel

# -- logging never reads a tensor on the training thread ---------------------------------------


def _forked_worker_context(sent: list[bytes]) -> LaunchContext:
    """A worker's launch of two processes: the channel sends from its own thread."""
    return LaunchContext(rank=0, world_size=2, send=lambda message: sent.append(encode(message)))


def test_accelerator_log_of_tensors_never_reads_them_on_the_training_thread(monkeypatch):
    readers: list[str] = []
    real_item, real_float = torch.Tensor.item, torch.Tensor.__float__

    def item(self: torch.Tensor) -> Any:
        readers.append(threading.current_thread().name)
        return real_item(self)

    def as_float(self: torch.Tensor) -> float:
        readers.append(threading.current_thread().name)
        return real_float(self)

    losses = [torch.tensor(1.0 / (step + 1)) for step in range(20)]
    sent: list[bytes] = []
    context = _forked_worker_context(sent)
    accelerator = Accelerator()  # one process; the launch below stands for a worker's
    with active_launch(context):
        monkeypatch.setattr(torch.Tensor, "item", item)
        monkeypatch.setattr(torch.Tensor, "__float__", as_float)
        for step, loss in enumerate(losses):
            accelerator.log({"loss": loss, "lr": torch.tensor(0.1)}, step=step)
            loss.mul_(100)  # an in-place change after logging must not reach what was logged
        training_thread = threading.current_thread().name
        on_training_thread = [name for name in readers if name == training_thread]
        metrics.close_channel(context)
    monkeypatch.undo()
    assert on_training_thread == [], "log() read a tensor where the loop runs"
    assert readers, "the values were read by the sender thread"
    expected = [real_item(loss) / 100 for loss in losses]
    received = MetricsAggregator()
    for data in sent:
        received.add_batch(decode(data))  # type: ignore[arg-type]
    assert [value for _, value in received.history("loss")] == pytest.approx(expected)
    assert [record["values"]["loss"] for record in accelerator.logged] == pytest.approx(expected)


def test_the_history_an_accelerator_keeps_is_bounded():
    accelerator = Accelerator()
    capacity = accelerator.logged.capacity
    assert 0 < capacity <= 10_000
    for step in range(capacity + 50):
        accelerator.log({"loss": float(step)}, step=step)
    assert len(accelerator.logged) == capacity
    assert accelerator.logged[0] == {"step": 50, "values": {"loss": 50.0}}
    assert accelerator.logged[-1]["step"] == capacity + 49


_ACCEPTED = [
    ({"loss": np.float32(0.5)}, None, {"loss": 0.5}),
    ({"loss": np.int64(3)}, np.int64(2), {"loss": 3.0}),
    ({"loss": torch.tensor([0.25])}, 0, {"loss": 0.25}),
    ({"loss": 2}, 7, {"loss": 2.0}),
]
_REFUSED = [
    ({"loss": "low"}, None, TypeError, "'loss' is str"),
    ({"b": 10**400}, None, ValueError, "'b' cannot be stored as a float"),
    ({"loss": torch.ones(2)}, None, TypeError, "'loss' is Tensor with 2 elements"),
    ({"flag": True}, None, TypeError, "'flag' is bool"),
    ({"z": torch.tensor(1j)}, None, TypeError, "'z' is Tensor of torch.complex64"),
    ({"z": np.complex64(1j)}, None, TypeError, "'z' is complex64"),
    ({"loss": 1.0}, -1, TypeError, r"step=...\) must be a non-negative int"),
    ({"loss": 1.0}, 1.5, TypeError, r"step=...\) must be a non-negative int"),
]


@pytest.mark.parametrize(("values", "step", "logged"), _ACCEPTED)
def test_both_log_calls_accept_the_same_values(values, step, logged):
    sent: list[bytes] = []
    context = _forked_worker_context(sent)
    accelerator = Accelerator()
    with active_launch(context):
        accelerator.log(values, step=step)
        notebook_kit.log(values, step=step)
        metrics.close_channel(context)
    records = [record for data in sent for record in decode(data).records]
    expected_step = None if step is None else int(step)
    assert records == [(0, expected_step, logged)] * 2
    assert list(accelerator.logged) == [{"step": expected_step, "values": logged}]


@pytest.mark.parametrize(("values", "step", "error", "message"), _REFUSED)
def test_both_log_calls_refuse_the_same_values_naming_the_key(values, step, error, message):
    accelerator = Accelerator()
    for log in (accelerator.log, notebook_kit.log):
        with pytest.raises(error, match=message):
            log(values, step=step)
    assert len(accelerator.logged) == 0


def test_nothing_logged_can_stop_the_sender_or_fail_the_end_of_the_run():
    # What integrations hand the channel directly is not checked: it must survive anything.
    sent: list[bytes] = []
    context = _forked_worker_context(sent)
    metrics.log_from_worker(context, {"huge": 10**400, "loss": 1.0}, step=0)
    sender = metrics.channel(context)._thread
    assert sender is not None
    sender.join(0.3)
    assert sender.is_alive(), "the sender thread died on a value"
    metrics.log_from_worker(context, {"loss": 0.5}, step=1)
    metrics.close_channel(context)  # raises nothing
    records = [record for data in sent for record in decode(data).records]
    assert records == [(0, 0, {"loss": 1.0}), (0, 1, {"loss": 0.5})]


# -- fp16 with a fused optimizer ---------------------------------------------------------------


def test_fp16_overflow_with_a_fused_optimizer_is_a_skipped_step_and_holds_the_scheduler():
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    assert optimizer.optimizer._step_supports_amp_scaling, "GradScaler always steps this one"
    before = model.weight.detach().clone()
    for scale in (float("inf"), 1e-3):
        loss = model(torch.ones(3, 4)).mean() * scale
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if scale == float("inf"):
            assert accelerator.optimizer_step_was_skipped
            assert scheduler.get_last_lr() == [0.1], "the scheduler stepped on a skipped step"
            assert torch.equal(before, model.weight.detach())
    assert not accelerator.optimizer_step_was_skipped
    assert scheduler.get_last_lr() == [0.05]
    assert not torch.equal(before, model.weight.detach())


# -- the fork probe: driver errors said, no unbounded wait, the report agrees with the launch --


@pytest.mark.integration
@pytest.mark.parametrize(
    ("driver_answer", "meaning"),
    [(803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"), (999, "CUDA_ERROR_UNKNOWN"), (4242, "error")],
)
def test_a_driver_that_fails_to_start_is_named_in_the_banner_of_the_cpu_run(
    monkeypatch, driver_answer, meaning
):
    # The probe really forks; only the driver's answer to cuInit in the child is simulated.
    monkeypatch.setattr(environment, "_cuda_compiled", lambda: True)
    monkeypatch.setattr(environment, "_gpus_seen", {})
    monkeypatch.setattr(environment, "_driver_init_status", lambda: driver_answer)
    state = environment.probe_kernel()
    assert (state.cuda_bad_fork, state.cuda_devices) == (False, 0)
    for config in (LaunchConfig(), LaunchConfig(num_processes=2)):
        plan = make_plan(config)
        assert plan.device == "cpu"
        assert f"cuInit returned {driver_answer}" in plan.banner()
        assert meaning in plan.banner() and plan.banner().endswith("the run is on CPU")
    assert f"cuInit returned {driver_answer}" in environment.environment().to_text()


def test_a_probe_that_could_not_tell_is_named_in_the_banner_of_a_run_in_the_kernel(monkeypatch):
    state = KernelState(cuda_bad_fork=False, cuda_devices=0, probe_error="it hung")
    monkeypatch.setattr(plan_module, "probe_kernel", lambda: state)
    plan = make_plan(LaunchConfig(num_processes=1))
    assert plan.in_process and "could not check for GPUs (it hung)" in plan.banner()


def test_nccl_from_a_tainted_kernel_names_the_cuda_context_not_the_gpu_count(monkeypatch):
    state = KernelState(cuda_bad_fork=True, cuda_devices=0)
    monkeypatch.setattr(plan_module, "probe_kernel", lambda: state)
    monkeypatch.setattr(preflight, "_gpu_run_in_kernel", False)
    with pytest.raises(ForkSafetyError, match="A library other than torch created a CUDA"):
        make_plan(LaunchConfig(num_processes=2, backend="nccl"))


@pytest.mark.integration
def test_a_probe_child_that_survives_sigkill_is_given_up_after_a_deadline(monkeypatch):
    # A child stuck in a hung driver sleeps uninterruptibly: SIGKILL does not end it. Standing
    # in for it, a child that sleeps while the kill is held back.
    monkeypatch.setattr(forked_probe, "_kill_child", lambda pid: None)
    monkeypatch.setattr(forked_probe, "_EXIT_GRACE_S", 0.2)
    monkeypatch.setattr(forked_probe, "_KILL_GRACE_S", 0.2)
    monkeypatch.setattr(forked_probe, "_abandoned_probes", set())
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not answer within"):
        forked_probe.run_in_fork(lambda: time.sleep(20), timeout=0.3)
    assert time.monotonic() - started < 3, "the kernel waited for a child that cannot die"
    (pid,) = forked_probe._abandoned_probes
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


@pytest.mark.integration
def test_the_report_and_the_launch_agree_after_a_cuda_context_made_behind_torch(monkeypatch):
    monkeypatch.setattr(environment, "_cuda_compiled", lambda: True)
    monkeypatch.setattr(environment, "_gpus_seen", {})
    monkeypatch.setattr(environment, "_driver_init_status", lambda: 0)
    assert environment.environment().fork_safe
    # cupy or a bare cuInit: the driver is loaded here now, and a forked child is refused.
    monkeypatch.setattr(environment, "_driver_loaded_here", lambda: True)
    monkeypatch.setattr(environment, "_driver_init_status", lambda: 3)
    report = environment.environment()
    assert not report.fork_safe and report.to_dict()["fork_safe"] is False
    assert "NO: CUDA is initialised in this process (by a library other" in report.to_text()
    monkeypatch.setenv("NOTEBOOK_KIT_START_METHOD", "fork")  # refused only when fork is asked
    with pytest.raises(ForkSafetyError, match="A library other than torch"):
        notebook_launcher(lambda: None, num_processes=2)


# -- nothing that comes home or is asked in the kernel initialises CUDA ------------------------


def _rebuilt_on_its_gpu(seed: int) -> torch.Generator:
    raise AssertionError("a GPU generator was rebuilt on its GPU: CUDA starts in the kernel")


class _GpuGenerator(torch.Generator):
    """A generator that lives on a GPU as far as pickling can tell (no GPU needed)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)

    def __reduce__(self) -> Any:  # what a CUDA generator pickles as: rebuilt on its device
        return _rebuilt_on_its_gpu, (self.initial_seed(),)


def test_a_returned_gpu_generator_comes_home_as_a_cpu_generator_with_its_seed():
    generator = _GpuGenerator()
    generator.manual_seed(1234)
    home = pickle.loads(dumps_for_kernel({"rng": [generator]}))["rng"][0]
    assert type(home) is torch.Generator and home.device.type == "cpu"
    assert home.initial_seed() == 1234
    cpu = torch.Generator().manual_seed(5)
    assert pickle.loads(dumps_for_kernel(cpu)).get_state().equal(cpu.get_state())


def test_capturing_rng_states_does_not_ask_cuda_when_it_is_not_initialised(monkeypatch):
    # Under MIG, is_available() cannot count through NVML and initialises CUDA instead.
    def initialising() -> bool:
        raise AssertionError("is_available() called: it may initialise CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", initialising)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    states = get_rng_states()
    assert "cuda" not in states
    set_rng_states({**states, "cuda": [torch.zeros(16, dtype=torch.uint8)]})


def test_under_torchrun_the_gpu_is_made_current_before_the_nccl_group_is_created(monkeypatch):
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set", device)))
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend, kw))
    )
    monkeypatch.setattr(dist, "TCPStore", lambda *args, **kwargs: dist.HashStore())
    monkeypatch.setattr(dist, "is_initialized", lambda: any(c[0] == "init" for c in calls))
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    resolve_process_state(cpu=False)
    assert calls[0] == ("set", torch.device("cuda", 1))
    assert calls[1][:2] == ("init", "nccl")
    assert calls[1][2]["device_id"] == torch.device("cuda", 1)


@pytest.mark.integration
def test_single_node_workers_keep_nccl_bootstrap_on_loopback():
    def interfaces() -> tuple[str | None, str | None]:
        return os.environ.get("NCCL_SOCKET_IFNAME"), os.environ.get("GLOO_SOCKET_IFNAME")

    assert notebook_launcher(interfaces, num_processes=2, live=False) == ("lo", "lo")
