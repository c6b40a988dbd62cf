"""``ProfileKwargs`` and ``accelerator.profile()`` in one process: fields, schedule, errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from notebook_kit.accelerator import Accelerator, ProfileKwargs


def _work() -> None:
    torch.randn(16, 16) @ torch.randn(16, 16)


def test_the_block_yields_torchs_profiler_and_records_what_ran_in_it():
    with Accelerator().profile() as prof:
        _work()
    assert isinstance(prof, torch.profiler.profile)
    assert "aten::mm" in {event.key for event in prof.key_averages()}


def test_schedule_option_steps_through_wait_warmup_and_active_with_prof_step():
    ready: list[int] = []
    kwargs = ProfileKwargs(
        schedule_option=dict(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=lambda prof: ready.append(prof.step_num),
    )
    with Accelerator(kwargs_handlers=[kwargs]).profile() as prof:
        for _ in range(6):
            _work()
            prof.step()
    # One cycle: step 0 waits, 1 warms up, 2 and 3 record; it is handed over after step 3.
    assert ready == [4]
    assert prof.step_num == 6


def test_a_handler_given_to_profile_wins_over_the_constructors(tmp_path):
    accelerator = Accelerator(kwargs_handlers=[ProfileKwargs(output_trace_dir=None)])
    with accelerator.profile(ProfileKwargs(output_trace_dir=str(tmp_path / "traces"))):
        _work()
    trace = json.loads((tmp_path / "traces" / "profile_0.json").read_text())
    assert any(event.get("name") == "aten::mm" for event in trace["traceEvents"])


def test_a_block_that_raises_writes_no_trace(tmp_path):
    accelerator = Accelerator(kwargs_handlers=[ProfileKwargs(output_trace_dir=str(tmp_path))])
    with pytest.raises(ZeroDivisionError), accelerator.profile():
        _work()
        _ = 1 / 0
    assert list(tmp_path.iterdir()) == []


def test_accelerates_own_profile_kwargs_is_taken_field_by_field(tmp_path):
    accelerate = pytest.importorskip("accelerate.utils")
    theirs = accelerate.ProfileKwargs(activities=["cpu"], record_shapes=True)
    accelerator = Accelerator(kwargs_handlers=[theirs])
    assert accelerator.handlers.profile == ProfileKwargs(activities=["cpu"], record_shapes=True)
    given = accelerate.ProfileKwargs(output_trace_dir=str(tmp_path))
    with accelerator.profile(given):
        _work()
    assert (tmp_path / "profile_0.json").exists()


@pytest.mark.parametrize(
    ("fields", "error", "words"),
    [
        (dict(activities=["gpu"]), ValueError, "ProfileKwargs.activities: 'gpu' is not"),
        (dict(activities="cpu"), TypeError, "ProfileKwargs.activities must be a list"),
        (dict(schedule_option=dict(wait=1, warmup=1)), ValueError, "lacks 'active'"),
        (dict(schedule_option=dict(wait=1, warmup=1, active=1, cycles=2)), ValueError, "'cycles'"),
        (dict(schedule_option=dict(wait=1, warmup=1, active=0)), ValueError, "['active']"),
        (dict(schedule_option=[1, 1, 1]), TypeError, "schedule_option must be a dict"),
        (dict(on_trace_ready="print"), TypeError, "on_trace_ready must be a function"),
        (dict(with_stack=1), TypeError, "ProfileKwargs.with_stack must be True or False"),
        (dict(output_trace_dir=3), TypeError, "output_trace_dir must be a folder path"),
    ],
)
def test_bad_fields_are_refused_when_made_naming_the_field(fields, error, words):
    with pytest.raises(error) as raised:
        ProfileKwargs(**fields)
    assert words in str(raised.value)


def test_accelerates_object_with_a_bad_activity_is_refused_before_the_block():
    accelerate = pytest.importorskip("accelerate.utils")
    with pytest.raises(ValueError, match="'tpu' is not an activity"):
        Accelerator(kwargs_handlers=[accelerate.ProfileKwargs(activities=["tpu"])])


def test_profile_handler_of_another_kind_is_refused_naming_the_argument():
    with pytest.raises(TypeError, match="profile_handler must be a ProfileKwargs"):
        Accelerator().profile({"activities": ["cpu"]})


def test_the_fields_and_defaults_are_accelerates():
    accelerate = pytest.importorskip("accelerate.utils")

    def fields(cls: type) -> list[tuple[str, object]]:
        return [(field.name, field.default) for field in dataclasses.fields(cls)]

    assert fields(ProfileKwargs) == fields(accelerate.ProfileKwargs)
