"""Decisions made for GPU machines, checked on the CPU with the fork probe's readings simulated.

The probe itself really forks in these tests; only what the child reads from the CUDA driver
(or the probe's whole answer, for the plan's arithmetic) is simulated. ``tests/gpu/`` checks
the same decisions for real where a GPU is present.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

from notebook_kit import Accelerator, ForkSafetyError, LaunchConfig, notebook_launcher
from notebook_kit.config import environment
from notebook_kit.config.environment import KernelState
from notebook_kit.launch import plan as plan_module
from notebook_kit.launch import preflight
from notebook_kit.launch.plan import make_plan
from notebook_kit.runtime import metrics, throughput
from notebook_kit.runtime.context import LaunchContext

H200 = "NVIDIA H200"


def _machine(monkeypatch: pytest.MonkeyPatch, gpus: int, bad_fork: bool = False) -> None:
    """Make the launch see ``gpus`` GPUs (as the fork probe would report them)."""
    state = KernelState(cuda_bad_fork=bad_fork, cuda_devices=0 if bad_fork else gpus,
                        gpu_names=(H200,) * (0 if bad_fork else gpus))  # fmt: skip
    monkeypatch.setattr(plan_module, "probe_kernel", lambda: state)


@pytest.fixture(autouse=True)
def _fresh_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU run noted and no GPUs remembered, as in a kernel that just started."""
    monkeypatch.setattr(preflight, "_gpu_run_in_kernel", False)
    monkeypatch.setattr(environment, "_gpus_seen", {})


# -- where the run goes ------------------------------------------------------------------------


def test_one_process_with_a_gpu_trains_on_it_in_the_kernel(monkeypatch):
    _machine(monkeypatch, gpus=1)
    plan = make_plan(LaunchConfig())
    assert (plan.num_processes, plan.in_process, plan.device) == (1, True, "cuda")
    assert plan.banner() == f"Running 1 process in this kernel on cuda:0 ({H200})"


def test_more_processes_than_gpus_run_on_cpu_and_the_banner_says_why(monkeypatch):
    _machine(monkeypatch, gpus=1)
    plan = make_plan(LaunchConfig(num_processes=2))
    assert (plan.backend, plan.device) == ("gloo", "cpu")
    assert plan.banner().endswith(
        "2 processes but 1 GPU visible: the workers run on CPU (gloo); "
        "use num_processes=1 to train on the GPU"
    )


def test_nccl_with_too_few_gpus_is_refused_before_anything_starts(monkeypatch):
    _machine(monkeypatch, gpus=1)
    with pytest.raises(ValueError, match="backend='nccl' needs one GPU per process"):
        make_plan(LaunchConfig(num_processes=2, backend="nccl"))


def test_one_gpu_per_process_uses_nccl_on_the_gpus(monkeypatch):
    _machine(monkeypatch, gpus=2)
    plan = make_plan(LaunchConfig())
    assert (plan.num_processes, plan.backend, plan.device) == (2, "nccl", "cuda")
    assert plan.banner().startswith(f"Launching 2 processes on 2 GPUs ({H200}) (nccl)")


def test_isolate_forks_one_worker_onto_the_gpu_with_nccl(monkeypatch):
    _machine(monkeypatch, gpus=1)
    plan = make_plan(LaunchConfig(), isolate=True)
    assert (plan.in_process, plan.backend, plan.device) == (False, "nccl", "cuda")
    assert plan.banner().startswith(f"Launching 1 process on cuda:0 ({H200}) (nccl)")


def test_explicit_gloo_keeps_the_cpu_and_says_so(monkeypatch):
    _machine(monkeypatch, gpus=2)
    plan = make_plan(LaunchConfig(num_processes=2, backend="gloo"))
    assert plan.device == "cpu" and "backend='gloo'" in plan.banner()


def test_without_gpus_nothing_is_said_about_them(monkeypatch):
    _machine(monkeypatch, gpus=0)
    for config in (LaunchConfig(), LaunchConfig(num_processes=2)):
        plan = make_plan(config)
        assert plan.device == "cpu" and plan.cpu_reason is None
        assert "GPU" not in plan.banner()


def test_isolate_must_be_a_bool():
    with pytest.raises(TypeError, match="isolate must be True or False"):
        notebook_launcher(print, isolate="yes")


# -- fork safety sees every CUDA context -------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    ("driver_answer", "expected"),
    [(3, "A library other than torch created a CUDA context"), (0, None), (100, None)],
)
def test_a_cuda_context_made_by_any_library_is_refused(monkeypatch, driver_answer, expected):
    # The probe really forks; the driver's answer to cuInit in the child is simulated:
    # 3 (CUDA_ERROR_NOT_INITIALIZED) after cupy, numba, jax or a bare cuInit in the kernel,
    # 0 in a clean kernel, 100 (no device) on a machine without a usable GPU.
    monkeypatch.setattr(environment, "_cuda_compiled", lambda: True)
    monkeypatch.setattr(preflight, "_cuda_compiled", lambda: True)
    monkeypatch.setattr(environment, "_driver_init_status", lambda: driver_answer)
    monkeypatch.setenv("NOTEBOOK_KIT_START_METHOD", "fork")  # refused only when fork is asked
    state = environment.probe_kernel()
    assert state.cuda_bad_fork is (expected is not None)
    if expected is None:
        assert preflight.check_fork_safety(state) is state
        return
    with pytest.raises(ForkSafetyError, match=expected) as refused:
        notebook_launcher(lambda: None, num_processes=2)
    assert "isolate=True" in str(refused.value)


def test_after_a_gpu_run_in_the_kernel_the_refusal_names_that_run(monkeypatch):
    preflight.note_gpu_run_in_kernel()
    with pytest.raises(ForkSafetyError, match="earlier launch with num_processes=1 trained on"):
        preflight.check_fork_safety(KernelState(cuda_bad_fork=True, cuda_devices=0))


def test_a_probe_that_could_not_answer_refuses_instead_of_guessing_safe():
    state = KernelState(cuda_bad_fork=False, cuda_devices=0, probe_error="it hung")
    with pytest.raises(ForkSafetyError, match=r"Could not check .* it hung"):
        preflight.check_fork_safety(state)


@pytest.mark.integration
def test_a_probe_child_that_fails_is_reported_not_taken_for_safe(monkeypatch):
    monkeypatch.setattr(environment, "_cuda_compiled", lambda: True)

    def broken() -> int:
        raise OSError("driver library is broken")

    monkeypatch.setattr(environment, "_driver_init_status", broken)
    state = environment.probe_kernel()
    assert state.probe_error is not None and "driver library is broken" in state.probe_error


# -- prepare keeps the user's objects ----------------------------------------------------------


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.config = {"hidden": 2}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def generate(self, x: torch.Tensor) -> torch.Tensor:
        return self(x).argmax(-1)


def test_mixed_precision_on_one_process_returns_the_same_module():
    model = Net()
    inner: list[torch.dtype] = []
    model.linear.register_forward_hook(lambda _m, _i, out: inner.append(out.dtype))
    prepared = Accelerator(mixed_precision="bf16").prepare(model)
    assert prepared is model and isinstance(prepared, Net)
    assert prepared.config == {"hidden": 2} and prepared.linear.weight is model.linear.weight
    output = prepared(torch.randn(4, 3))
    assert inner == [torch.bfloat16] and output.dtype == torch.float32
    assert prepared.generate(torch.randn(4, 3)).shape == (4,)


def test_unwrap_without_the_fp32_wrapper_gives_the_original_forward():
    model = Net()
    accelerator = Accelerator(mixed_precision="bf16")
    accelerator.prepare(model)
    unwrapped = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    assert unwrapped is model and "forward" not in model.__dict__
    assert model(torch.randn(2, 3)).dtype == torch.float32
    inner: list[torch.dtype] = []
    model.linear.register_forward_hook(lambda _m, _i, out: inner.append(out.dtype))
    model(torch.randn(2, 3))
    assert inner == [torch.float32], "no autocast after unwrapping"


def test_a_prepared_model_pickles_and_saves_without_wrappers(tmp_path):
    model = Net()
    accelerator = Accelerator(mixed_precision="bf16", project_dir=str(tmp_path))
    accelerator.prepare(model)
    clone = pickle.loads(pickle.dumps(model))
    assert isinstance(clone, Net) and clone(torch.randn(2, 3)).dtype == torch.float32
    assert set(accelerator.get_state_dict(model)) == set(Net().state_dict())
    path = accelerator.save_state()
    saved = b"".join(p.read_bytes() for p in path.rglob("*") if p.is_file())
    assert b"AutocastForward" not in saved


def _ddp_module_is_the_users(model: nn.Module) -> bool:
    prepared = Accelerator(mixed_precision="bf16").prepare(model)
    return prepared.module is model and "forward" not in model.__dict__


@pytest.mark.integration
def test_under_ddp_the_wrapped_module_is_the_users_untouched():
    assert notebook_launcher(_ddp_module_is_the_users, args=(Net(),), num_processes=2)


@pytest.mark.integration
def test_a_kernel_run_leaves_the_kernel_model_with_its_own_forward():
    model = Net()

    def train(net: Net) -> bool:
        accelerator = Accelerator()
        prepared = accelerator.prepare(net)
        return prepared is net and "forward" in net.__dict__

    assert notebook_launcher(train, args=(model,), num_processes=1, mixed_precision="bf16")
    assert "forward" not in model.__dict__


# -- no hidden syncs in logging ----------------------------------------------------------------


class _PendingScalar(throughput.DeviceScalar):
    """A GPU scalar whose copy has not arrived yet; arrives when told (no GPU needed)."""

    def __init__(self, value: float) -> None:  # no super(): nothing is on a device
        self.host = torch.tensor(value)
        self.arrived = self  # type: ignore[assignment]
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def test_gpu_values_still_on_their_way_are_sent_later_in_order_without_waiting():
    sent: list[tuple[int | None, dict]] = []
    context = LaunchContext(send=lambda batch: sent.extend(
        (step, values) for _, step, values in batch.records))  # fmt: skip
    channel = metrics.channel(context)
    assert channel.direct, "a world of one sends on the training thread: it must not wait"
    pending = _PendingScalar(0.5)
    channel.log(0, {"loss": pending})
    channel.log(1, {"loss": 0.25})
    assert sent == [] and not pending.done, "nothing waited for the device"
    pending.done = True
    channel.log(2, {"loss": 0.125})
    assert sent == [(0, {"loss": 0.5}), (1, {"loss": 0.25}), (2, {"loss": 0.125})]
    late = _PendingScalar(1.0)
    channel.log(3, {"loss": late})
    channel.close()
    assert sent[-1] == (3, {"loss": 1.0}) and late.done, "the end of a run waits for the rest"


@pytest.mark.integration
def test_while_the_driver_is_not_loaded_a_launch_forks_no_probe(monkeypatch):
    forks: list[str] = []
    real_run_in_fork = environment._run_in_fork

    def counted(function, *args, **kwargs):
        forks.append(function.__name__)
        return real_run_in_fork(function, *args, **kwargs)

    monkeypatch.setattr(environment, "_cuda_compiled", lambda: True)
    monkeypatch.setattr(environment, "_driver_init_status", lambda: 0)
    monkeypatch.setattr(environment, "_run_in_fork", counted)
    loaded = [False]
    monkeypatch.setattr(environment, "_driver_loaded_here", lambda: loaded[0])
    assert not environment.probe_kernel().cuda_bad_fork
    assert not environment.probe_kernel().cuda_bad_fork
    assert forks == ["_cuda_state_in_child"], "GPUs are found once; no driver, no context"
    loaded[0] = True  # something loaded the driver: only a forked child can tell
    environment.probe_kernel()
    assert len(forks) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # other GPUs visible: found again
    loaded[0] = False
    environment.probe_kernel()
    assert len(forks) == 3


def test_importing_torch_and_notebook_kit_loads_no_cuda_driver():
    # So a launch needs no probe fork; where the driver is loaded, probe_kernel forks to ask.
    assert environment._driver_loaded_here() is False
