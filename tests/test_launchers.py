"""One Launcher interface: which class runs a plan, the one driver both entry points share, and
the forked launcher drawing its view while the workers start without losing what they send."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from multiprocessing import Pipe
from typing import Any, ClassVar

import psutil
import pytest
import torch.distributed as dist

import notebook_kit
from notebook_kit.launch import launcher as entry_points
from notebook_kit.launch.launcher import resolve_plan
from notebook_kit.launch.launchers import Launcher, driver, select_launcher
from notebook_kit.launch.launchers.forked import ForkedLauncher
from notebook_kit.launch.launchers.kernel_and_torchrun import InKernelLauncher, TorchrunLauncher
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, RankSummary
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch


def test_each_plan_gets_its_own_way_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    assert type(select_launcher(resolve_plan({"num_processes": 2}, "t"))) is ForkedLauncher
    assert type(select_launcher(resolve_plan({"num_processes": 1}, "t"))) is InKernelLauncher
    isolated = resolve_plan({"num_processes": 1, "isolate": True}, "t")
    assert type(select_launcher(isolated)) is ForkedLauncher
    torchrun = {"TORCHELASTIC_RUN_ID": "job", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    assert type(select_launcher(resolve_plan({"num_processes": 2}, "t"))) is TorchrunLauncher


class _OnePipe(Launcher):
    """A made-up way to run: waits once on a pipe the test fills, then returns rank 0's value."""

    cleaned_up: ClassVar[list[str]] = []

    def run(self, call: Any, observer: Any) -> Any:
        function, args, kwargs = call
        view = self.view(observer)
        flag = StopFlag()
        view.on_start(LaunchInfo("made up", 1, 1, (0,), flag))
        reader, writer = Pipe(duplex=False)
        writer.send_bytes(b"ready")
        try:
            ready = yield [reader], 5.0
            assert ready == [reader]
            return function(*args, **kwargs)
        finally:
            reader.close()
            writer.close()
            self.cleaned_up.append("closed")
            view.on_finish(LaunchSummary((RankSummary(0, 0, 0.0),), 0.0))
            flag.close()


def test_a_new_way_to_run_is_one_class_that_both_entry_points_drive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chosen: list[Any] = []

    def select(plan: Any) -> Launcher:
        chosen.append(plan)
        return _OnePipe(plan)

    monkeypatch.setattr(entry_points, "select_launcher", select)
    _OnePipe.cleaned_up = []
    assert notebook_kit.notebook_launcher(lambda x: x * 2, args=(21,), live=False) == 42
    awaited = notebook_kit.notebook_launcher_async(lambda: "awaited", num_processes=3, live=False)
    assert asyncio.run(awaited) == "awaited"
    assert [plan.num_processes for plan in chosen] == [1, 3]
    assert _OnePipe.cleaned_up == ["closed", "closed"]


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "awaitable"])
def test_an_interrupt_while_waiting_is_thrown_into_the_launcher_which_cleans_up(
    monkeypatch: pytest.MonkeyPatch, awaited: bool
) -> None:
    def interrupted(*_: Any) -> list[Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "wait", interrupted)
    _OnePipe.cleaned_up = []
    steps = _OnePipe(resolve_plan({"num_processes": 1}, "t")).run((int, (), {}), _Quiet())
    with pytest.raises(KeyboardInterrupt):
        if awaited:
            asyncio.run(driver.run_awaitable(steps))
        else:
            driver.run_blocking(steps)
    assert _OnePipe.cleaned_up == ["closed"]


class _Quiet:
    def on_start(self, info: LaunchInfo) -> None: ...
    def on_output(self, rank: int, stream: str, line: str) -> None: ...
    def on_metrics(self, batch: MetricsBatch) -> None: ...
    def on_tick(self) -> None: ...
    def on_finish(self, summary: LaunchSummary) -> None: ...


class _SlowView(_Quiet):
    """A view that takes long to build, and checks the workers were forked before it."""

    def __init__(self) -> None:
        self.children_at_start = -1
        self.events: list[str] = []
        self.lines: list[tuple[int, str]] = []
        self.records: list[tuple[int, int | None]] = []

    def on_start(self, info: LaunchInfo) -> None:
        self.children_at_start = len(psutil.Process().children())
        self.events.append("start")
        time.sleep(0.5)  # the workers print and log meanwhile

    def on_output(self, rank: int, stream: str, line: str) -> None:
        self.events.append("output")
        self.lines.append((rank, line))

    def on_metrics(self, batch: MetricsBatch) -> None:
        self.events.append("metrics")
        self.records += [(rank, step) for rank, step, _ in batch.records]

    def on_finish(self, summary: LaunchSummary) -> None:
        self.events.append("finish")


def _talk_at_once() -> int:
    rank = dist.get_rank()
    for step in range(30):
        print(f"rank {rank} line {step}")
        notebook_kit.log({"loss": float(step)}, step=step)
    sys.stdout.flush()
    return os.getpid()


@pytest.mark.integration
@pytest.mark.usefixtures("no_leftover_processes")
def test_the_view_is_built_after_the_fork_and_gets_everything_sent_meanwhile_once() -> None:
    view = _SlowView()
    notebook_kit.notebook_launcher(_talk_at_once, num_processes=2, observer=view)
    assert view.children_at_start >= 1, "the view was built before the workers were forked"
    assert view.events[0] == "start" and view.events[-1] == "finish"
    expected = [(rank, f"rank {rank} line {step}") for rank in (0, 1) for step in range(30)]
    assert sorted(view.lines) == sorted(expected)  # each line once, none lost
    assert sorted(view.records) == [(rank, step) for rank in (0, 1) for step in range(30)]
