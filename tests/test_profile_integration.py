"""``accelerator.profile()`` on two launched ranks: one Chrome trace each, named as Accelerate."""

from __future__ import annotations

import json

import pytest
import torch

from notebook_kit import notebook_launcher
from notebook_kit.accelerator import Accelerator, ProfileKwargs

pytestmark = pytest.mark.integration


def _profiled_steps(folder: str, accelerates: bool) -> list[int]:
    """Six scheduled steps with an all_reduce each; every rank says when its cycle was ready."""
    ready: list[int] = []
    fields = dict(
        activities=["cpu"],
        schedule_option=dict(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=lambda prof: ready.append(prof.step_num),
        output_trace_dir=folder,
    )
    if accelerates:
        from accelerate.utils import ProfileKwargs as AcceleratesProfileKwargs

        kwargs = AcceleratesProfileKwargs(**fields)
    else:
        kwargs = ProfileKwargs(**fields)
    accelerator = Accelerator(kwargs_handlers=[kwargs])
    with accelerator.profile() as prof:
        for _ in range(6):
            value = torch.ones(8) * (accelerator.process_index + 1)
            torch.distributed.all_reduce(value)
            prof.step()
    return accelerator.gather_for_metrics([ready], use_gather_object=True)


@pytest.mark.parametrize("accelerates", [False, True], ids=["ours", "accelerates_object"])
def test_two_ranks_write_two_traces_named_as_accelerate_names_them(tmp_path, accelerates):
    if accelerates:
        pytest.importorskip("accelerate")
    ready = notebook_launcher(
        _profiled_steps, args=(str(tmp_path), accelerates), num_processes=2, live=False
    )
    assert ready == [[4], [4]]  # each rank's one cycle handed over after its fourth step
    assert sorted(path.name for path in tmp_path.iterdir()) == ["profile_0.json", "profile_1.json"]
    for rank in (0, 1):
        events = json.loads((tmp_path / f"profile_{rank}.json").read_text())["traceEvents"]
        names = {event.get("name") for event in events}
        assert "ProfilerStep#3" in names  # the recorded steps of the schedule, and no other
        assert "ProfilerStep#1" not in names
        assert any("allreduce" in str(name).lower() for name in names)
