"""Accelerator in one plain process: arguments, inherited settings, precision, stepping rules."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from notebook_kit import Accelerator, set_seed
from notebook_kit.accelerator.optimizer import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
    GradientState,
)
from notebook_kit.accelerator.partial_state import AcceleratorState
from notebook_kit.accelerator.partial_state import split_inputs as _split
from notebook_kit.accelerator.precision import MIXED_PRECISION_CHOICES
from notebook_kit.accelerator.strategies import fsdp_from_settings
from notebook_kit.config.schema import SETTINGS
from notebook_kit.live.metrics import MetricsAggregator
from notebook_kit.runtime.context import LaunchContext, active_launch
from notebook_kit.runtime.messages import MetricsBatch, decode, encode


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mixed_precision": "fp32"}, "mixed_precision must be one of 'no', 'fp16', 'bf16'"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be an integer"),
        ({"split_batches": "yes"}, "split_batches must be True or False"),
        ({"even_batches": "no"}, "even_batches must be True or False"),
        ({"cpu": 1}, "cpu must be True or False"),
        ({"log_with": "comet_ml"}, "log_with='comet_ml' is not a tracker .* 'all', 'tensorboard'"),
        ({"log_with": "tensorboard"}, 'log_with="tensorboard" writes files: give .* project_dir'),
    ],
)
def test_bad_arguments_name_the_parameter_and_the_choices(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Accelerator(**kwargs)


def test_settings_precedence_argument_launch_environment_default(monkeypatch):
    assert Accelerator().mixed_precision == "no"
    assert Accelerator().gradient_accumulation_steps == 1
    monkeypatch.setenv("NOTEBOOK_KIT_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("NOTEBOOK_KIT_GRADIENT_ACCUMULATION_STEPS", "3")
    assert Accelerator().mixed_precision == "bf16"
    assert Accelerator().gradient_accumulation_steps == 3
    with active_launch(LaunchContext(mixed_precision="fp16", gradient_accumulation_steps=2)):
        assert Accelerator().mixed_precision == "fp16"
        assert Accelerator().gradient_accumulation_steps == 2
        explicit = Accelerator(mixed_precision="no", gradient_accumulation_steps=4)
        assert (explicit.mixed_precision, explicit.gradient_accumulation_steps) == ("no", 4)
    monkeypatch.setenv("NOTEBOOK_KIT_MIXED_PRECISION", "half")
    with pytest.raises(ValueError, match="NOTEBOOK_KIT_MIXED_PRECISION='half'"):
        Accelerator()


def test_a_worker_reads_each_setting_variable_as_the_launcher_does(monkeypatch):
    """One declaration: the schema's variable names, words, ranges and yes/no spellings."""
    for name, text in [
        ("gradient_accumulation_steps", "5000"),  # beyond the launcher's ceiling
        ("use_fsdp", "maybe"),
        ("mixed_precision", "fp8"),
    ]:
        variable = SETTINGS[name].env_var
        monkeypatch.setenv(variable, text)
        with pytest.raises(ValueError, match=f"{variable}='{text}' is not valid: {name} must be"):
            Accelerator()
        monkeypatch.delenv(variable)
    monkeypatch.setenv(SETTINGS["use_fsdp"].env_var, "false")
    assert fsdp_from_settings(None) is None
    monkeypatch.setenv(SETTINGS["use_fsdp"].env_var, "true")
    assert fsdp_from_settings(None) is not None
    monkeypatch.setenv(SETTINGS["mixed_precision"].env_var, "half")
    with pytest.raises(ValueError, match="NOTEBOOK_KIT_MIXED_PRECISION='half'"):
        AcceleratorState()  # checked here too, not only by the Accelerator
    assert SETTINGS["mixed_precision"].choices == MIXED_PRECISION_CHOICES


def test_plain_process_state():
    accelerator = Accelerator()
    assert (accelerator.process_index, accelerator.num_processes) == (0, 1)
    assert accelerator.is_main_process and accelerator.is_local_main_process
    assert accelerator.is_last_process and not accelerator.use_distributed
    assert accelerator.device.type in ("cpu", "cuda")
    assert Accelerator(cpu=True).device == torch.device("cpu")


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 8)
        self.out = nn.Linear(8, 1)
        self.seen: list[torch.dtype] = []
        self.hidden.register_forward_hook(lambda _m, _i, output: self.seen.append(output.dtype))

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def test_bf16_runs_the_forward_in_bfloat16_on_the_users_own_module():
    accelerator = Accelerator(mixed_precision="bf16", cpu=True)
    net = _Net()
    prepared = accelerator.prepare(net)
    assert prepared is net, "one process: the prepared model is the user's object"
    output = prepared(torch.randn(3, 4))
    assert net.seen == [torch.bfloat16] and output.dtype == torch.float32
    assert accelerator.unwrap_model(prepared) is net
    accelerator.unwrap_model(prepared, keep_fp32_wrapper=False)
    assert "forward" not in vars(net), "unwrapped without the wrapper: its own forward again"
    net(torch.randn(3, 4))
    assert net.seen[-1] == torch.float32
    with accelerator.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_fp16_path_uses_a_grad_scaler_and_keeps_the_loss_finite():
    # CPU float16 autocast exists in torch, so the scaler path runs here; on GPU it is the same.
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    assert accelerator.scaler is not None and accelerator.scaler.get_scale() > 1
    set_seed(0)
    net = _Net()
    model, optimizer = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    for _ in range(3):
        before = [parameter.detach().clone() for parameter in net.parameters()]
        loss = model(torch.randn(8, 4)).pow(2).mean()
        assert net.seen[-1] == torch.float16 and torch.isfinite(loss)
        # The true gradients of this very loss, without any scaling.
        expected = torch.autograd.grad(loss, list(net.parameters()), retain_graph=True)
        accelerator.backward(loss)  # scaled up...
        norm = accelerator.clip_grad_norm_(model.parameters(), 1e6)  # ...unscaled, not clipped
        for parameter, grad in zip(net.parameters(), expected, strict=True):
            torch.testing.assert_close(parameter.grad, grad, rtol=1e-2, atol=1e-5)
        expected_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in expected]))
        torch.testing.assert_close(norm, expected_norm, rtol=1e-2, atol=1e-5)
        optimizer.step()
        assert accelerator.optimizer_step_was_skipped is False
        for old, parameter in zip(before, net.parameters(), strict=True):
            torch.testing.assert_close(parameter.detach(), old - 0.1 * parameter.grad)
        optimizer.zero_grad()
    assert accelerator.scaler.get_scale() > 1  # no overflow: the scale never collapsed


def test_fp16_step_is_reported_skipped_exactly_when_gradients_overflow():
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    net = _Net()
    model, optimizer = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    accelerator.backward(model(torch.randn(8, 4)).pow(2).mean())
    optimizer.step()
    assert not accelerator.optimizer_step_was_skipped
    optimizer.zero_grad()
    accelerator.backward(model(torch.randn(8, 4)).pow(2).mean() * float("inf"))
    before = [parameter.detach().clone() for parameter in net.parameters()]
    optimizer.step()
    assert accelerator.optimizer_step_was_skipped
    assert all(torch.equal(b, p) for b, p in zip(before, net.parameters(), strict=True))


def test_accumulation_steps_the_optimizer_and_scheduler_only_on_sync():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    data = DataLoader(TensorDataset(torch.randn(10, 2)), batch_size=2)
    model, optimizer, data, scheduler = accelerator.prepare(model, optimizer, data, scheduler)
    syncs = []
    for (x,) in data:
        with accelerator.accumulate(model):
            accelerator.backward(model(x).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            syncs.append(accelerator.sync_gradients)
    assert syncs == [False, True, False, True, True], "the last batch always syncs"
    assert scheduler.get_last_lr() == [0.1 * 0.5**3]


@pytest.mark.parametrize(("split_batches", "expected"), [(False, 3), (True, 1)])
def test_scheduler_advances_once_per_process_unless_batches_are_split(split_batches, expected):
    optimizer = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    state = GradientState(1)
    wrapped = AcceleratedOptimizer(optimizer, state)
    scheduler = AcceleratedScheduler(
        torch.optim.lr_scheduler.StepLR(optimizer, 1), [wrapped], state, 3, split_batches
    )
    wrapped.step()
    scheduler.step()
    assert scheduler.last_epoch == expected


def test_prepare_keeps_order_and_passes_unknown_objects_through():
    accelerator = Accelerator()
    model = nn.Linear(1, 1)
    marker = object()
    prepared_model, same_marker = accelerator.prepare(model, marker)
    assert prepared_model is model and same_marker is marker
    with pytest.raises(ValueError, match="state_dict"):
        accelerator.register_for_checkpointing(object())


def test_split_between_processes_shares():
    shares = [_split(list(range(5)), rank, 2, apply_padding=False) for rank in range(2)]
    assert shares == [[0, 1, 2], [3, 4]]
    assert _split(list(range(5)), 1, 2, apply_padding=True) == [3, 4, 4]
    assert _split({"a": torch.arange(3)}, 1, 2, False)["a"].tolist() == [2]
    with Accelerator().split_between_processes(["x", "y"]) as mine:
        assert mine == ["x", "y"]


def test_log_keeps_history_and_sends_to_the_kernel():
    sent = []
    with active_launch(LaunchContext(send=lambda message: sent.append(encode(message)))):
        accelerator = Accelerator()
        accelerator.log({"loss": torch.tensor(0.5), "lr": 1}, step=3)
    assert accelerator.logged == [{"step": 3, "values": {"loss": 0.5, "lr": 1.0}}]
    received = MetricsAggregator()
    batches = [decode(data) for data in sent]
    assert all(isinstance(batch, MetricsBatch) for batch in batches)
    for batch in batches:
        received.add_batch(batch)  # type: ignore[arg-type]
    assert received.histories() == {"loss": [(3, 0.5)], "lr": [(3, 1.0)]}
    with pytest.raises(TypeError, match="'name' is str"):
        accelerator.log({"name": "x"})


def test_main_process_helpers(tmp_path, capsys):
    accelerator = Accelerator()
    accelerator.print("hello")
    assert capsys.readouterr().out == "hello\n"
    assert accelerator.on_main_process(lambda: 7)() == 7
    assert accelerator.on_process(process_index=1)(lambda: 7)() is None
    with accelerator.main_process_first():
        accelerator.wait_for_everyone()
    accelerator.save({"w": torch.ones(1)}, tmp_path / "w.pt")
    assert [path.name for path in tmp_path.iterdir()] == ["w.pt"]
    accelerator.set_trigger()
    assert accelerator.check_trigger() and not accelerator.check_trigger()
