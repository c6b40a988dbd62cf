"""Running the function in the calling process: one process, or a process torchrun started.

With ``num_processes=1`` the kernel itself runs the function (debuggable: exceptions and
``%debug`` land in the user's frame) inside a gloo group of one. Under torchrun the processes
already exist, so launching means running here, inside the job's group; the default text view
then speaks on rank 0 only (one banner, one summary line with the mean over ranks, as a
notebook launch shows), while every rank still prints its own output.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from notebook_kit.accelerator.precision import restore_forward
from notebook_kit.config.launch_plan import LaunchPlan
from notebook_kit.launch.plan import Call
from notebook_kit.launch.preflight import note_gpu_run_in_kernel
from notebook_kit.live.headless import HeadlessObserver, QuietObserver
from notebook_kit.live.observer import LaunchInfo, LaunchObserver, LaunchSummary, RankSummary
from notebook_kit.runtime.context import (
    LaunchContext,
    StopFlag,
    active_launch,
    current_launch,
    temporary_environment,
)
from notebook_kit.runtime.messages import MetricsBatch, WorkerMessage
from notebook_kit.runtime.process_group import init_group_from_environment
from notebook_kit.runtime.seeding import set_seed
from notebook_kit.worker.memory_history import recording_memory, run_folder

__all__ = ["KERNEL_PLACE", "run_in_calling_process", "torchrun_place"]


def run_in_calling_process(
    call: Call, plan: LaunchPlan, observer: LaunchObserver, place: _Place
) -> Any:
    """Run in the calling process (debuggable), inside a process group.

    Under torchrun (``place`` from :func:`torchrun_place`) the group is the job's, from its
    environment; otherwise (:data:`KERNEL_PLACE`) a gloo group of one. Exceptions propagate
    unchanged, so ``%debug`` lands in the user's frame.
    """
    function, args, kwargs = call
    if place.rank != 0 and type(observer) is HeadlessObserver:
        observer = QuietObserver()  # the job's lines are rank 0's, as in a notebook launch
    newest = _NewestValues(place.rank)
    stop_flag = StopFlag()
    context = LaunchContext(
        rank=place.rank,
        local_rank=place.local_rank,
        world_size=place.world_size,
        local_world_size=place.local_world_size,
        backend="gloo",
        device=plan.device if place.world_size == 1 else "cpu",
        mixed_precision=plan.mixed_precision,
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        storage_timeout=plan.storage_timeout,
        send=lambda message: _deliver(observer, message, newest),
        stop_flag=stop_flag,
        restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    )
    banner = plan.banner() if place.world_size == 1 else place.banner()
    observer.on_start(LaunchInfo(banner, 1, place.world_size, (place.rank,), stop_flag))
    if plan.seed is not None:
        set_seed(plan.seed)
    if context.device == "cuda":
        note_gpu_run_in_kernel()  # from here on, forking onto the GPU is refused, with reason
    started = time.monotonic()
    error: BaseException | None = None
    try:
        with _caller_process_group(place, context), active_launch(context):
            try:
                with recording_memory(plan.memory_history, place.rank, context.device, _folder()):
                    result = function(*args, **kwargs)
            finally:
                context.close()
                for model in context.prepared_models:  # the kernel's own objects: as they were
                    restore_forward(model)
            if place.world_size > 1:
                _share_newest_values(observer, newest)
            return result
    except BaseException as raised:
        error = raised
        raise
    finally:
        duration = time.monotonic() - started
        observer.on_finish(
            LaunchSummary(
                ranks=(RankSummary(place.rank, 0 if error is None else 1, duration),),
                duration=duration,
                interrupted=isinstance(error, KeyboardInterrupt),
                stopped=stop_flag.is_set(),
                error=error,
            )
        )
        stop_flag.close()


def _folder() -> Path:
    """Where this process's snapshots go, under ``memory_history=True``."""
    return run_folder(f"process-{os.getpid()}")


def _deliver(observer: LaunchObserver, message: WorkerMessage, newest: _NewestValues) -> None:
    """Hand a message to the observer; with no wait loop here, each message is its tick."""
    if isinstance(message, MetricsBatch):
        newest.take(message)
        observer.on_metrics(message)
    observer.on_tick()


class _NewestValues:
    """This rank's newest ``(step, value)`` per metric, numbered as the kernel numbers them."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.values: dict[str, tuple[int, float]] = {}
        self._next_step = 0

    def take(self, batch: MetricsBatch) -> None:
        for _, step, values in batch.records:
            step = self._next_step if step is None else int(step)
            self._next_step = step + 1
            for name, value in values.items():
                self.values[name] = (step, value)


def _share_newest_values(observer: LaunchObserver, newest: _NewestValues) -> None:
    """Give rank 0's observer every rank's newest values, so its summary shows the mean.

    A collective: every rank of the job calls it after its function returned.
    """
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, newest.values)
    if newest.rank != 0:
        return
    for peer, values in enumerate(everyone):
        if peer == newest.rank or not values:
            continue
        records = tuple((peer, step, {name: value}) for name, (step, value) in values.items())
        observer.on_metrics(MetricsBatch(peer, records, dropped=0))


@dataclass(frozen=True)
class _Place:
    """Where the calling process stands in its job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    def banner(self) -> str:
        return (
            f"Running under torchrun as rank {self.rank} of {self.world_size}: torchrun's "
            f"processes are used, num_processes is ignored"
        )


KERNEL_PLACE = _Place(0, 0, 1, 1)  # the kernel alone: a world of one


def torchrun_place() -> _Place | None:
    """The caller's rank when torchrun started it (then launching means: run here)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or current_launch() is not None:
        return None
    environ = os.environ
    return _Place(
        rank=int(environ["RANK"]),
        local_rank=int(environ["LOCAL_RANK"]),
        world_size=int(environ["WORLD_SIZE"]),
        local_world_size=int(environ.get("LOCAL_WORLD_SIZE", environ["WORLD_SIZE"])),
    )


@contextlib.contextmanager
def _caller_process_group(place: _Place, context: LaunchContext) -> Iterator[None]:
    """The job's group under torchrun, a gloo group of one otherwise; kept if one exists."""
    if dist.is_initialized():
        context.backend = dist.get_backend()
        if context.backend == "nccl":
            context.device = "cuda"
        yield
        return
    if place.world_size > 1:
        use_cuda = torch.cuda.is_available()
        context.backend = "nccl" if use_cuda else "gloo"
        context.device = "cuda" if use_cuda else "cpu"
        device = torch.device("cuda", place.local_rank) if use_cuda else None
        init_group_from_environment(context.backend, device=device)  # sets the device first
        environment: dict[str, str] = {}
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        environment = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    try:
        with temporary_environment(environment):
            yield
    finally:
        dist.destroy_process_group()
