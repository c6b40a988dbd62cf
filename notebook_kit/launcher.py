"""``notebook_launcher``: run a training function on N forked processes from a notebook."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

import torch
import torch.distributed as dist

from notebook_kit import arguments
from notebook_kit.display import default_observer
from notebook_kit.errors import WorkerError
from notebook_kit.forking import fork_workers, open_listener
from notebook_kit.homecoming import find_kernel_models, load_home_weights
from notebook_kit.observer import LaunchInfo, LaunchObserver, LaunchSummary, RankSummary
from notebook_kit.plan import LOOPBACK, LaunchPlan, make_plan
from notebook_kit.preflight import check_fork_safety
from notebook_kit.runtime import LaunchContext, StopFlag, active_launch, current_launch
from notebook_kit.supervisor import Supervisor, interrupts_deferred

__all__ = ["notebook_launcher", "notebook_launcher_async"]

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    mixed_precision: arguments.MixedPrecision | None = None,
    use_port: int | None = None,
    master_addr: str = LOOPBACK,
    node_rank: int = 0,
    num_nodes: int = 1,
    backend: arguments.Backend | None = None,
    threads_per_process: int | None = None,
    timeout: float | None = None,
    gradient_accumulation_steps: int | None = None,
    rendezvous_timeout: float = 300.0,
    max_restarts: int = 0,
    live: bool | None = None,
    observer: LaunchObserver | None = None,
) -> Any:
    """Run ``function(*args, **kwargs)`` on ``num_processes`` forked workers and return rank 0's
    result.

    Each worker has ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` set and an initialised default process group (gloo on
    CPU, nccl when every local rank has a GPU). The function is never pickled, so functions
    defined in notebook cells, closures and lambdas work. Models created in the kernel and
    given to ``Accelerator.prepare`` come back holding rank 0's trained weights.

    Args:
        function: The training function.
        args: Positional arguments for ``function``.
        num_processes: Workers on this node; 1 runs in the calling process. Default: one per
            GPU when CUDA is available, else 1.
        kwargs: Keyword arguments for ``function``.
        mixed_precision: "no", "fp16" or "bf16"; every worker's ``Accelerator`` inherits it.
        use_port: Rendezvous port; default: a free port (single node) or 29500 (multi-node).
        master_addr: Address of node 0 (multi-node only; one node always uses loopback).
        node_rank: Index of this node in a multi-node job.
        num_nodes: Number of nodes; the world size is ``num_nodes * num_processes``.
        backend: "gloo" or "nccl"; default: chosen from the hardware.
        threads_per_process: torch threads per worker; default: cores // processes.
        timeout: Seconds after which the run is stopped and TimeoutError raised.
        gradient_accumulation_steps: Inherited by every worker's ``Accelerator``.
        rendezvous_timeout: Seconds to wait for the other nodes to join.
        max_restarts: Times all workers are started again after a rank fails; a function
            that calls ``accelerator.load_state()`` first resumes from its last checkpoint.
        live: Show live plots, progress and a Stop button (None: when a notebook front end
            is there); False shows nothing but errors.
        observer: Receives worker output and messages instead of the default display.

    Returns:
        What ``function`` returned on rank 0 (in a multi-node job: on this node's first rank).

    Raises:
        WorkerError: A rank raised or died; the message holds its traceback.
        TimeoutError: ``timeout`` passed; all workers were stopped.
        ForkSafetyError: CUDA or a process group is already initialised in the kernel.
        PortInUseError: ``use_port`` is taken.

    Example:
        >>> def train(lr):
        ...     import torch.distributed as dist
        ...     return dist.get_world_size() * lr
        >>> notebook_launcher(train, args=(0.1,), num_processes=2)
        0.2
    """
    call, plan = _resolve(function, args, kwargs, locals())
    observer = observer or default_observer(live)
    if plan.in_process or _torchrun_place():
        return _run_in_process(call, plan, observer)
    steps = _attempts(call, plan, observer)
    request = next(steps)
    try:
        while True:
            try:
                ready = wait(*request)
            except BaseException as error:  # Ctrl-C: the attempt cleans up, then re-raises
                request = steps.throw(error)
            else:
                request = steps.send(ready)
    except StopIteration as finished:
        return finished.value


async def notebook_launcher_async(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    **options: Any,
) -> Any:
    """``await`` form of :func:`notebook_launcher`, with the same arguments and result.

    While the workers run, the kernel's event loop stays free, so widget events (a Stop
    button click) are handled during the run, not after it.

    Example:
        >>> result = await notebook_launcher_async(train, num_processes=2)
    """
    observer = options.pop("observer", None)
    live = options.pop("live", None)
    kwargs = options.pop("kwargs", None)
    call, plan = _resolve(function, args, kwargs, {"num_processes": num_processes, **options})
    observer = observer or default_observer(live)
    if plan.in_process or _torchrun_place():
        return _run_in_process(call, plan, observer)
    loop = asyncio.get_running_loop()
    steps = _attempts(call, plan, observer)
    request = next(steps)
    try:
        while True:
            try:
                ready = await loop.run_in_executor(None, wait, *request)
            except BaseException as error:  # cancelled or interrupted: clean up, re-raise
                request = steps.throw(error)
            else:
                request = steps.send(ready)
    except StopIteration as finished:
        return finished.value


WaitRequest = tuple[list[Any], float]


def _attempts(
    call: Call, plan: LaunchPlan, observer: LaunchObserver
) -> Generator[WaitRequest, list[Any], Any]:
    """Run the launch, restarting after failures, without doing any waiting itself.

    Yields what to wait on (objects, timeout) and receives what became ready, so the blocking
    and the awaitable launcher share every step; an exception thrown in (Ctrl-C) stops the
    workers and propagates. Returns rank 0's value.
    """
    restart = 0
    while True:
        launch = _ForkedLaunch(call, plan, observer, restart)
        error: BaseException | None = None
        try:
            launch.start()
            while (limit := launch.supervisor.wait_limit()) is not None:
                launch.supervisor.serve((yield launch.supervisor.waitables(), limit))
        except BaseException as raised:
            error = raised
        done, value = launch.conclude(error)
        if done:
            return value
        restart += 1


_PLAN_OPTIONS = (
    "num_processes", "mixed_precision", "use_port", "master_addr", "node_rank", "num_nodes",
    "backend", "threads_per_process", "gradient_accumulation_steps", "rendezvous_timeout",
    "timeout", "max_restarts",
)  # fmt: skip


def _resolve(
    function: Any, args: Any, kwargs: Any, options: Mapping[str, Any]
) -> tuple[Call, LaunchPlan]:
    """Check the call and every option; nothing has been started when this raises."""
    unknown = set(options) - set(_PLAN_OPTIONS) - {"function", "args", "kwargs", "observer", "live"}
    if unknown:
        raise TypeError(
            f"notebook_launcher got unexpected arguments {sorted(unknown)}; "
            f"valid options are {', '.join(_PLAN_OPTIONS)}."
        )
    function = arguments.check_function(function)
    args, kwargs = arguments.check_args(args, kwargs)
    plan = make_plan(**{name: options[name] for name in _PLAN_OPTIONS if name in options})
    return (function, args, kwargs), plan


# -- one process: run in the kernel ------------------------------------------------------------


def _run_in_process(call: Call, plan: LaunchPlan, observer: LaunchObserver) -> Any:
    """Run in the calling process (debuggable), inside a process group.

    Under torchrun the group is the job's (from its environment); otherwise a gloo group of
    one. Exceptions propagate unchanged, so ``%debug`` lands in the user's frame.
    """
    function, args, kwargs = call
    place = _torchrun_place() or _Place(0, 0, 1, 1)
    stop_flag = StopFlag()
    context = LaunchContext(
        rank=place.rank,
        local_rank=place.local_rank,
        world_size=place.world_size,
        local_world_size=place.local_world_size,
        backend="gloo",
        mixed_precision=plan.mixed_precision,
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        send=lambda kind, payload: observer.on_message(place.rank, kind, payload),
        stop_flag=stop_flag,
    )
    banner = plan.banner() if place.world_size == 1 else place.banner()
    observer.on_start(LaunchInfo(banner, 1, place.world_size, (place.rank,), stop_flag, True))
    started = time.monotonic()
    error: BaseException | None = None
    try:
        with _caller_process_group(place, context), active_launch(context):
            try:
                return function(*args, **kwargs)
            finally:
                context.close()
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


def _torchrun_place() -> _Place | None:
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
        yield
        return
    if place.world_size > 1:
        use_cuda = torch.cuda.is_available()
        context.backend = "nccl" if use_cuda else "gloo"
        if use_cuda:
            torch.cuda.set_device(place.local_rank)
        dist.init_process_group(context.backend)  # env:// from torchrun
        environment: dict[str, str] = {}
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        environment = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    try:
        with _temporary_environment(environment):
            yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _temporary_environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- N processes: fork and supervise -----------------------------------------------------------


class _ForkedLaunch:
    """One multi-process launch: ``start``, a wait loop over ``supervisor``, then ``finish``."""

    def __init__(
        self, call: Call, plan: LaunchPlan, observer: LaunchObserver, restart_count: int = 0
    ) -> None:
        self.call = call
        self.restart_count = restart_count
        self.plan = plan
        self.observer = observer
        self.stop_flag = StopFlag()
        self.supervisor = Supervisor([], observer)
        self.kernel_models = find_kernel_models(*call)
        self._started = time.monotonic()
        self._announced = False

    def start(self) -> None:
        """Check the kernel, tell the observer, fork every worker."""
        check_fork_safety()
        with open_listener(self.plan) or contextlib.nullcontext() as listener:
            ranks = tuple(self.plan.global_rank(i) for i in range(self.plan.num_processes))
            info = LaunchInfo(
                self.plan.banner(),
                self.plan.num_processes,
                self.plan.world_size,
                ranks,
                self.stop_flag,
            )
            self.observer.on_start(info)
            self._announced = True
            self._started = time.monotonic()
            fork_workers(
                self.call,
                self.plan,
                listener,
                self.stop_flag,
                frozenset(self.kernel_models),
                self.supervisor.workers,
                self.restart_count,
            )
        self.supervisor.start_clock(self.plan.timeout)

    def conclude(self, error: BaseException | None) -> tuple[bool, Any]:
        """Finish this attempt: ``(True, value)``, ``(False, None)`` to restart, or raise."""
        try:
            return True, self.finish(error)
        except WorkerError as failure:
            if error is not None or self.restart_count >= self.plan.max_restarts:
                raise
            print(
                f"Rank {failure.rank} failed ({failure.failure.summary()}); restarting all "
                f"workers (restart {self.restart_count + 1} of {self.plan.max_restarts}).",
                flush=True,
            )
            return False, None

    def finish(self, error: BaseException | None) -> Any:
        """Stop what still runs, tell the observer, return rank 0's value or raise."""
        with interrupts_deferred():
            self.supervisor.shutdown()
        outcome = self.supervisor.outcome()
        if self._announced:
            self.observer.on_finish(self._summary(outcome, error))
        self.stop_flag.close()
        if error is not None:
            raise error
        if outcome.timed_out:
            raise TimeoutError(
                f"The launch did not finish within timeout={self.plan.timeout} s; all "
                f"{self.plan.num_processes} workers were stopped. Raise timeout or pass None."
            )
        if outcome.failures:
            raise WorkerError(outcome.failures, self.plan.world_size)
        result = outcome.result or {}
        load_home_weights(self.kernel_models, result.get("weights", {}))
        return result.get("value")

    def _summary(self, outcome: Any, error: BaseException | None) -> LaunchSummary:
        return LaunchSummary(
            ranks=self.supervisor.rank_summaries(),
            duration=time.monotonic() - self._started,
            failures=tuple(outcome.failures),
            timed_out=outcome.timed_out,
            interrupted=isinstance(error, (KeyboardInterrupt, asyncio.CancelledError)),
            stopped=self.stop_flag.is_set(),
            error=error,
        )
