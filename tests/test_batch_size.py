"""find_executable_batch_size in one process (Accelerate's cases), and the launch's agreement.

The single-process cases mirror Accelerate's ``tests/test_memory_utils.py``, with the halving
this decorator keeps by default (each step of a launch's search restarts every rank). The
agreement cases drive the kernel's restart policy with attempts that end as a rank's
out-of-memory error would, without forking: the launch itself is tested in
``test_batch_size_integration.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from typing import Any

import pytest
import torch

import notebook_kit
from notebook_kit.accelerator.batch_size import find_executable_batch_size
from notebook_kit.errors import WorkerError, WorkerFailure
from notebook_kit.launch.restarts import AttemptEnding, RestartPolicy
from notebook_kit.runtime.batch_agreement import (
    AGREED_SIZES_VARIABLE,
    BatchSizeReduction,
    reduction_of,
)
from notebook_kit.runtime.context import LaunchContext, active_launch, temporary_environment


def _out_of_memory() -> None:
    raise RuntimeError("CPU out of memory.")


def test_the_size_halves_until_the_function_runs_and_its_arguments_pass_through() -> None:
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=128)
    def loop(batch_size: int, word: str) -> tuple[int, str]:
        tried.append(batch_size)
        if batch_size != 8:
            _out_of_memory()
        return batch_size, word

    assert loop("hello") == (8, "hello")
    assert tried == [128, 64, 32, 16, 8]
    assert loop("again") == (8, "again") and tried[-1] == 8  # the size found is kept
    assert notebook_kit.find_executable_batch_size is find_executable_batch_size
    assert notebook_kit.accelerator.find_executable_batch_size is find_executable_batch_size


def test_reaching_zero_names_the_function_and_its_starting_size() -> None:
    @find_executable_batch_size(starting_batch_size=0)
    def never(batch_size: int) -> None:
        raise AssertionError("not called at size 0")

    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero"):
        never()

    @find_executable_batch_size(starting_batch_size=16)
    def always(batch_size: int) -> None:
        raise torch.OutOfMemoryError("whatever the allocator says")

    with pytest.raises(RuntimeError, match=r"always ran out .*starting_batch_size=16"):
        always()


def test_a_custom_reduction_is_used_in_both_forms_and_must_shrink() -> None:
    def run(as_decorator: bool) -> list[int]:
        tried: list[int] = []
        current = 256

        def quarter() -> int:
            nonlocal current
            current //= 4
            return current

        def loop(batch_size: int) -> int:
            tried.append(batch_size)
            if batch_size > 16:
                _out_of_memory()
            return batch_size

        if as_decorator:
            find_executable_batch_size(starting_batch_size=256, reduce_batch_size_fn=quarter)(
                loop
            )()
        else:
            find_executable_batch_size(
                loop, starting_batch_size=256, reduce_batch_size_fn=quarter
            )()
        return tried

    assert run(True) == run(False) == [256, 64, 16]

    @find_executable_batch_size(starting_batch_size=64, reduce_batch_size_fn=lambda: 32)
    def stuck(batch_size: int) -> None:
        _out_of_memory()

    with pytest.raises(ValueError, match="reduce_batch_size_fn returned 32 after 32"):
        stuck()


def test_passing_the_batch_size_is_a_type_error_and_other_errors_pass_through() -> None:
    @find_executable_batch_size(starting_batch_size=128)
    def f(batch_size: int, arg1: str, arg2: str) -> None:
        raise ValueError("Oops, we had an error!")

    with pytest.raises(
        TypeError, match=r"Batch size was passed into `f`.*`f\(arg1='hello', arg2='world'\)`"
    ):
        f(128, "hello", "world")
    with pytest.raises(ValueError, match="Oops, we had an error!"):
        f("hello", "world")


def test_several_ranks_outside_a_restarting_launch_are_refused_before_the_function_runs() -> None:
    ran: list[int] = []

    @find_executable_batch_size(starting_batch_size=8)
    def train(batch_size: int) -> None:
        ran.append(batch_size)

    os.environ.pop(AGREED_SIZES_VARIABLE, None)
    with (
        active_launch(LaunchContext(rank=1, world_size=2)),
        pytest.raises(
            RuntimeError, match=r"find_executable_batch_size of train.*notebook_launcher"
        ),
    ):
        train()
    # Two machines, each kernel restarting its own ranks only: refused though sizes are set.
    two_machines = active_launch(LaunchContext(rank=1, world_size=4, num_nodes=2))
    agreed = temporary_environment({AGREED_SIZES_VARIABLE: "{}"})
    with agreed, two_machines, pytest.raises(RuntimeError, match="without cluster="):
        train()
    assert ran == []
    with active_launch(LaunchContext(rank=0, world_size=1)):  # one rank: searched in place
        train()
    assert ran == [8]


def test_in_a_launch_a_rank_out_of_memory_asks_every_rank_to_restart_at_the_agreed_size() -> None:
    tried: list[int] = []
    current = 100

    def minus_thirty() -> int:  # restarted from the kernel's state: replayed to below the size
        nonlocal current
        current -= 30
        return current

    @find_executable_batch_size(starting_batch_size=100, reduce_batch_size_fn=minus_thirty)
    def train(batch_size: int) -> None:
        tried.append(batch_size)
        _out_of_memory()

    key = f"{__name__}.{train.__qualname__}:100"
    agreed = {AGREED_SIZES_VARIABLE: json.dumps({key: 40})}
    rank_1 = active_launch(LaunchContext(rank=1, world_size=2))
    with temporary_environment(agreed), rank_1, pytest.raises(BatchSizeReduction) as raised:
        train()
    assert tried == [40]  # the agreed size, not the starting one
    failure = WorkerFailure(
        1, 1, f"{BatchSizeReduction.__module__}.BatchSizeReduction", str(raised.value), "", 0.0
    )
    reduction = reduction_of(failure)
    assert reduction is not None and (reduction.rank, reduction.size, reduction.next_size) == (
        1,
        40,
        10,
    )
    assert reduction.key == key


def _reduction_ending(size: int, next_size: int, key: str = "m.train:64") -> AttemptEnding:
    error = BatchSizeReduction(1, size, next_size, "train", key)
    failure = WorkerFailure(
        1, 1, f"{BatchSizeReduction.__module__}.BatchSizeReduction", str(error), "", 0.0
    )
    return AttemptEnding(failure=WorkerError([failure], 2))


def _attempts(endings: list[AttemptEnding], seen: list[tuple[int, str | None]]) -> Any:
    def attempt(restart: int) -> Generator[Any, Any, AttemptEnding]:
        seen.append((restart, os.environ.get(AGREED_SIZES_VARIABLE)))  # the fork's step
        reply = yield "wait"
        assert reply == "ready"
        assert AGREED_SIZES_VARIABLE not in os.environ  # only while the workers are forked
        return endings.pop(0)

    return attempt


def _drive(policy: RestartPolicy, attempt: Any) -> Any:
    steps = policy.run_attempts(attempt)
    request = next(steps)
    try:
        while True:
            assert request == "wait"
            request = steps.send("ready")
    except StopIteration as done:
        return done.value


def test_the_policy_restarts_every_rank_smaller_without_charging_max_restarts(capsys) -> None:
    seen: list[tuple[int, str | None]] = []
    endings = [_reduction_ending(64, 32), _reduction_ending(32, 16), AttemptEnding(value="done")]
    policy = RestartPolicy(0, None, run="launch", everyone="all workers", agrees_batch_size=True)
    assert _drive(policy, _attempts(endings, seen)) == "done"
    assert seen == [(0, "{}"), (1, '{"m.train:64": 32}'), (2, '{"m.train:64": 16}')]
    said = capsys.readouterr().out
    assert "rank 1 ran out of memory at batch size 64: restarting every rank at 32" in said
    assert "at batch size 32: restarting every rank at 16" in said


def test_a_reduction_that_does_not_shrink_or_a_policy_without_agreement_is_a_failure() -> None:
    seen: list[tuple[int, str | None]] = []
    endings = [_reduction_ending(64, 32), _reduction_ending(64, 32)]  # 32 again: not smaller
    policy = RestartPolicy(0, None, run="launch", everyone="all workers", agrees_batch_size=True)
    with pytest.raises(WorkerError, match="restarting every rank at 32"):
        _drive(policy, _attempts(endings, seen))
    assert [restart for restart, _ in seen] == [0, 1]
    seen.clear()
    cluster = RestartPolicy(0, None, run="cluster run", everyone="all nodes")
    with pytest.raises(WorkerError):
        _drive(cluster, _attempts([_reduction_ending(64, 32)], seen))
    assert seen == [(0, None)]
