"""Integrations without forked workers: launch hooks, post-import actions, callback, trackers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import notebook_kit
from notebook_kit import Accelerator
from notebook_kit.integrations import activation
from notebook_kit.integrations.post_import import when_imported
from notebook_kit.integrations.trackers import check_log_with
from notebook_kit.runtime.context import LaunchContext, StopFlag, active_launch, add_launch_hook
from tests.optional import needs_tensorboard, needs_transformers


def _context(**fields: Any) -> tuple[LaunchContext, list[Any]]:
    """A launch of one process whose messages are collected instead of sent to a kernel."""
    sent: list[Any] = []
    context = LaunchContext(send=sent.append, **fields)
    return context, sent


# -- launch hooks and post-import actions ------------------------------------------------------


def test_launch_hooks_run_when_a_launch_becomes_active_and_end_with_it() -> None:
    events: list[str] = []

    class Hook:
        def __call__(self, context: LaunchContext) -> Any:
            events.append(f"enter {context.rank}")
            return self

        def __enter__(self) -> None:
            events.append("entered")

        def __exit__(self, *exc: Any) -> None:
            events.append("exited")

    hook = Hook()
    add_launch_hook(hook)
    add_launch_hook(hook)  # registered once
    try:
        with active_launch(LaunchContext(rank=3)):
            events.append("body")
    finally:
        from notebook_kit.runtime import context as context_module

        context_module._launch_hooks.remove(hook)
    assert events == ["enter 3", "entered", "body", "exited"]


def test_when_imported_acts_after_the_import_and_undoes_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "nk_probe_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []

    def action(module: Any) -> Any:
        seen.append(module.VALUE)
        module.VALUE = 2
        return lambda: setattr(module, "VALUE", 3)

    try:
        with when_imported("nk_probe_module", action):
            assert seen == []  # nothing imported it yet
            import nk_probe_module

            assert seen == [1] and nk_probe_module.VALUE == 2
        assert nk_probe_module.VALUE == 3
        assert not any(type(f).__name__ == "_PostImportFinder" for f in sys.meta_path)
        with when_imported("nk_probe_module", action):  # already imported: acts at once
            assert seen == [1, 3]
    finally:
        sys.modules.pop("nk_probe_module", None)


def test_a_cpu_launch_of_several_processes_tells_accelerate_to_use_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    with activation.activate(LaunchContext(world_size=2, backend="gloo")):
        assert os.environ["ACCELERATE_USE_CPU"] == "true"
        assert os.environ["FORK_LAUNCHED"] == "1"
    assert "ACCELERATE_USE_CPU" not in os.environ
    with activation.activate(LaunchContext(world_size=2, backend="nccl")):
        assert "ACCELERATE_USE_CPU" not in os.environ  # GPUs: Accelerate finds them itself


# -- the module-level calls --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: notebook_kit.log({"loss": "low"}), "'loss' is str"),
        (lambda: notebook_kit.log([("loss", 1.0)]), "takes a dict"),
        (lambda: notebook_kit.log({"loss": 1.0}, step=-1), "step=...\\) must be a non-negative"),
        (lambda: notebook_kit.progress(total=2.5), "total=...\\) must be a non-negative int"),
    ],
)
def test_bad_values_name_what_is_wrong(call: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        call()


def test_module_level_calls_feed_the_launch_in_the_kernel() -> None:
    import torch

    context, sent = _context(stop_flag=StopFlag())
    with active_launch(context):
        notebook_kit.progress(total=5)
        notebook_kit.log({"loss": torch.tensor(0.5), "lr": 0.1}, step=0)
        assert notebook_kit.should_stop() is False
        context.stop_flag.set()
        assert notebook_kit.should_stop() is True
    last = sent[-1].progress
    assert last.total == 5 and last.steps == 2
    assert [record for batch in sent for record in batch.records] == [
        (0, 0, {"loss": 0.5, "lr": 0.1})
    ]


# -- the Trainer callback ----------------------------------------------------------------------


@needs_transformers
def test_callback_logs_curves_counts_steps_and_stops_through_the_control() -> None:
    from transformers import TrainerControl, TrainerState

    from notebook_kit.integrations import LiveViewCallback

    callback, control = LiveViewCallback(), TrainerControl()
    state = TrainerState(max_steps=10, global_step=4)
    context, sent = _context(stop_flag=StopFlag())
    with active_launch(context):
        callback.on_train_begin(None, state, control, model=None)
        logs = {"loss": 0.7, "learning_rate": 1e-3, "epoch": 0.5, "train_runtime": 3.0,
                "eval_samples_per_second": 9.0, "total_flos": 1e9, "note": "text"}  # fmt: skip
        callback.on_log(None, state, control, logs=logs)
        callback.on_step_end(None, state, control)
        assert not control.should_training_stop
        context.stop_flag.set()
        callback.on_step_end(None, state, control)
        assert control.should_training_stop  # the Trainer's own flow ends the run
    records = [record for batch in sent for record in batch.records]
    assert records == [(0, 4, {"loss": 0.7, "learning_rate": 1e-3, "epoch": 0.5})]
    assert sent[-1].progress.total == 10 and sent[-1].progress.steps == 4


@needs_transformers
def test_trainers_built_in_a_launch_get_the_callback_and_lose_the_tqdm_bar(
    tmp_path: Path,
) -> None:
    import torch
    from transformers import Trainer, TrainingArguments

    from notebook_kit.integrations import LiveViewCallback

    activation.register()  # as the launcher does when it is imported
    original = Trainer.__init__
    arguments = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with active_launch(LaunchContext()):
        trainer = Trainer(model=torch.nn.Linear(2, 2), args=arguments)
        names = [type(callback).__name__ for callback in trainer.callback_handler.callbacks]
        assert "LiveViewCallback" in names and "ProgressCallback" not in names
        explicit = Trainer(
            model=torch.nn.Linear(2, 2), args=arguments, callbacks=[LiveViewCallback()]
        )
        live = [c for c in explicit.callback_handler.callbacks if isinstance(c, LiveViewCallback)]
        assert len(live) == 1  # a callback passed explicitly is not added twice
    assert Trainer.__init__ is original  # a run inside the kernel leaves transformers as it was
    outside = Trainer(model=torch.nn.Linear(2, 2), args=arguments)
    assert "ProgressCallback" in [type(c).__name__ for c in outside.callback_handler.callbacks]


# -- trackers of notebook_kit's Accelerator ----------------------------------------------------


class _RecordingTracker:
    """Accelerate's tracker interface, recording what it is given."""

    name = "recording"
    requires_logging_directory = False

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    @property
    def tracker(self) -> list[tuple[str, Any]]:
        return self.calls

    def start(self) -> None:
        self.calls.append(("start", None))

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.calls.append(("config", values))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.calls.append(("log", (values, step, kwargs)))

    def finish(self) -> None:
        self.calls.append(("finish", None))


def test_accelerator_writes_to_tracker_objects_and_finishes_them() -> None:
    tracker = _RecordingTracker()
    accelerator = Accelerator(log_with=[tracker, "all"])
    accelerator.log({"ignored before init": 1.0}, step=0)
    accelerator.init_trackers("run", config={"lr": 0.1})
    accelerator.log({"loss": 0.5}, step=1, log_kwargs={"recording": {"commit": True}})
    assert accelerator.get_tracker("recording", unwrap=True) is tracker.calls
    accelerator.end_training()
    assert tracker.calls == [
        ("start", None),
        ("config", {"lr": 0.1}),
        ("log", ({"loss": 0.5}, 1, {"commit": True})),
        ("finish", None),
    ]
    with pytest.raises(ValueError, match=r"No tracker named 'recording'.*started: none"):
        accelerator.get_tracker("recording")
    assert accelerator.logged[-1] == {"step": 1, "values": {"loss": 0.5}}


def test_log_with_names_are_checked_before_anything_starts() -> None:
    assert check_log_with(None, None) == []
    assert check_log_with(["all", "TensorBoard"], "runs") == ["all", "tensorboard"]
    with pytest.raises(ValueError, match=r"log_with='comet_ml' is not a tracker .*WandBTracker"):
        check_log_with(["all", "comet_ml"], "runs")


@needs_tensorboard
def test_tensorboard_files_are_readable_by_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accelerator = Accelerator(log_with="tensorboard", project_dir=tmp_path)
    accelerator.init_trackers("digits", config={"lr": 0.01, "model": object()})
    for step in range(3):
        accelerator.log({"loss": 1.0 / (step + 1)}, step=step)
    accelerator.end_training()
    events = EventAccumulator(str(tmp_path / "digits"))
    events.Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("loss")] == [
        (0, 1.0),
        (1, 0.5),
        (2, 0.3333),
    ]


# -- without the optional frameworks ----------------------------------------------------------

_BLOCK_FRAMEWORKS = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"transformers", "accelerate", "tensorboard", "wandb", "mlflow"}:
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())
"""
_WITHOUT_FRAMEWORKS = """
import sys
import notebook_kit, notebook_kit.integrations
from notebook_kit import Accelerator, notebook_launcher

def train():
    accelerator = Accelerator(log_with="all")
    accelerator.log({"loss": 1.0}, step=0)
    notebook_kit.log({"other": 2.0}, step=0)
    return accelerator.num_processes, notebook_kit.should_stop()

result = notebook_launcher(train, num_processes=2, live=False)
print(result, sorted(notebook_kit.last_run().metrics))
print([name for name in ("transformers", "accelerate", "tensorboard", "wandb", "mlflow")
       if name in sys.modules])
try:
    notebook_kit.integrations.LiveViewCallback
except ModuleNotFoundError as error:
    print("callback:", error)
"""


@pytest.mark.integration
@pytest.mark.parametrize("block", [True, False], ids=["frameworks absent", "frameworks unused"])
def test_launches_work_and_import_no_framework_unless_used(block: bool) -> None:
    code = textwrap.dedent((_BLOCK_FRAMEWORKS if block else "") + _WITHOUT_FRAMEWORKS)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["(2, False) ['loss', 'other']", "[]"], done.stdout
    if block:
        assert lines[2] == "callback: No module named 'transformers'"
