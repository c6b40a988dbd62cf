"""``notebook_launcher``: run a training function on N forked processes from a notebook."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Generator, Mapping
from multiprocessing.connection import wait
from typing import Any

from notebook_kit.config import arguments
from notebook_kit.config.launch_config import LaunchConfig, resolve_launch_config
from notebook_kit.config.launch_plan import DEFAULT_RENDEZVOUS_TIMEOUT, LaunchPlan
from notebook_kit.errors import WorkerError
from notebook_kit.integrations import activation as integrations
from notebook_kit.launch.forking import fork_workers, open_listener
from notebook_kit.launch.homecoming import find_kernel_models, load_home_weights
from notebook_kit.launch.in_kernel import run_in_process, torchrun_place
from notebook_kit.launch.interrupts import interrupts_survive_forks
from notebook_kit.launch.plan import Call, check_explicit_settings, make_plan
from notebook_kit.launch.preflight import check_fork_safety
from notebook_kit.launch.rendezvous_options import translate_rendezvous_options
from notebook_kit.launch.supervisor import Supervisor, interrupts_deferred
from notebook_kit.launch.warmup import start_warmup
from notebook_kit.live.display import default_observer
from notebook_kit.live.observer import LaunchInfo, LaunchObserver, LaunchSummary
from notebook_kit.runtime.context import StopFlag

__all__ = ["notebook_launcher", "notebook_launcher_async", "resolve_plan"]

start_warmup()  # from the import cell on, workers' one-time imports are paid here, once
integrations.register()  # every launch turns on the Trainer and Accelerate integrations


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    mixed_precision: arguments.MixedPrecision | None = None,
    use_port: int | None = None,
    master_addr: str | None = None,
    node_rank: int | None = None,
    num_nodes: int | None = None,
    backend: arguments.Backend | None = None,
    threads_per_process: int | None = None,
    timeout: float | None = None,
    gradient_accumulation_steps: int | None = None,
    rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT,
    max_restarts: int | None = None,
    seed: int | None = None,
    live: bool | None = None,
    isolate: bool = False,
    config: LaunchConfig | None = None,
    observer: LaunchObserver | None = None,
    rdzv_backend: str | None = None,
    rdzv_endpoint: str | None = None,
    rdzv_conf: Mapping[str, Any] | None = None,
    rdzv_id: str | None = None,
    monitor_interval: float | None = None,
    log_line_prefix_template: str | None = None,
) -> Any:
    """Run ``function(*args, **kwargs)`` on ``num_processes`` forked workers and return rank 0's
    result.

    Each worker has ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` set and an initialised default process group (gloo on
    CPU, nccl when every local rank has a GPU). The function is never pickled, so functions
    defined in notebook cells, closures and lambdas work. Models created in the kernel and
    given to ``Accelerator.prepare`` come back holding rank 0's trained weights.

    Settings left as None come from ``config``, else from the saved default
    (``notebook-kit config``), else from the built-in defaults below.

    Args:
        function: The training function.
        args: Positional arguments for ``function``.
        num_processes: Workers on this node; 1 runs in the calling process. Default: one per
            GPU when CUDA is available, else 1.
        kwargs: Keyword arguments for ``function``.
        mixed_precision: "no", "fp16" or "bf16"; every worker's ``Accelerator`` inherits it.
        use_port: Rendezvous port; default: a free port (single node) or 29500 (multi-node).
        master_addr: Address of node 0 (multi-node only; one node always uses loopback).
        node_rank: Index of this node in a multi-node job (default 0).
        num_nodes: Number of nodes (default 1); the world size is ``num_nodes * num_processes``.
        backend: "gloo" or "nccl"; default: chosen from the hardware.
        threads_per_process: torch threads per worker; default: cores // processes.
        timeout: Seconds after which the run is stopped and TimeoutError raised.
        gradient_accumulation_steps: Inherited by every worker's ``Accelerator``.
        rendezvous_timeout: Seconds to wait for the other nodes to join.
        max_restarts: Times all workers are started again after a rank fails (default 0); a
            function that calls ``accelerator.load_state()`` first resumes from its checkpoint.
        seed: Seeds torch, numpy and random in every worker before the function starts.
        live: Show live plots, progress and a Stop button (None: when a notebook front end
            is there); False shows nothing but errors.
        isolate: Run a single process in a forked worker instead of this kernel, so that
            training on the GPU leaves the kernel free of CUDA and later launches can still
            fork (``num_processes=1`` otherwise runs here, where ``%debug`` works).
        config: A ``LaunchConfig`` (e.g. ``ConfigPanel().config``) for the settings not given.
        observer: Receives worker output and messages instead of the default display.
        rdzv_backend, rdzv_endpoint, rdzv_conf, rdzv_id, monitor_interval,
            log_line_prefix_template: Accelerate's torch-elastic arguments, accepted: the
            endpoint gives ``master_addr``/``use_port``, ``rdzv_conf["timeout"]`` the
            ``rendezvous_timeout``; what has no meaning here is said in
            :mod:`notebook_kit.launch.rendezvous_options`.

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
    with interrupts_survive_forks():  # the kernel probe may fork
        call, plan = _resolve(function, args, kwargs, locals())
    observer = observer or default_observer(plan.live)
    if plan.in_process or torchrun_place():
        return run_in_process(call, plan, observer)
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
    kwargs = options.pop("kwargs", None)
    with interrupts_survive_forks():  # the kernel probe may fork
        call, plan = _resolve(function, args, kwargs, {"num_processes": num_processes, **options})
    observer = observer or default_observer(plan.live)
    if plan.in_process or torchrun_place():
        return run_in_process(call, plan, observer)
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
    check_fork_safety(plan.kernel)  # the kernel runs nothing between attempts: check once
    kernel_models = find_kernel_models(*call)
    restart = 0
    while True:
        launch = _ForkedLaunch(call, plan, observer, kernel_models, restart)
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


_SETTINGS = (
    "num_processes", "mixed_precision", "master_addr", "node_rank", "num_nodes", "backend",
    "threads_per_process", "gradient_accumulation_steps", "max_restarts", "seed", "live",
)  # fmt: skip
_OPTIONS = (*_SETTINGS, "use_port", "config", "timeout", "rendezvous_timeout", "isolate")


def _resolve(
    function: Any, args: Any, kwargs: Any, options: Mapping[str, Any]
) -> tuple[Call, LaunchPlan]:
    """Check the call and every option; nothing has been started when this raises.

    Explicit arguments win over ``config``, which wins over the saved default.
    """
    options = translate_rendezvous_options(options)
    extra = set(options) - {"function", "args", "kwargs", "observer"}
    unknown = extra - set(_OPTIONS)
    if unknown:  # before the function checks, as always
        resolve_plan({name: options[name] for name in unknown}, "notebook_launcher")
    function = arguments.check_function(function)
    args, kwargs = arguments.check_args(args, kwargs)
    plan = resolve_plan({name: options[name] for name in extra}, "notebook_launcher")
    return (function, args, kwargs), plan


def resolve_plan(
    options: Mapping[str, Any], caller: str, *, isolate: bool | None = None
) -> LaunchPlan:
    """The plan for ``options`` (the launcher's keyword arguments), checked before any fork.

    ``caller`` names the API in the error for an unknown option; ``isolate`` overrides the
    option of that name (a worker pool always forks, even for one process).

    Example:
        >>> resolve_plan({"num_processes": 2}, "WorkerPool").world_size
        2
    """
    unknown = set(options) - set(_OPTIONS)
    if unknown:
        raise TypeError(
            f"{caller} got unexpected arguments {sorted(unknown)}; "
            f"valid options are {', '.join(_OPTIONS)}."
        )
    config = options.get("config")
    if config is not None and not isinstance(config, LaunchConfig):
        raise TypeError(f"config must be a LaunchConfig, got {type(config).__name__}.")
    explicit = {name: options.get(name) for name in _SETTINGS}
    explicit["master_port"] = options.get("use_port")
    settings = resolve_launch_config(config, **check_explicit_settings(explicit))
    if isolate is None:
        isolate = arguments.check_bool("isolate", options.get("isolate", False))
    return make_plan(
        settings,
        timeout=options.get("timeout"),
        rendezvous_timeout=options.get("rendezvous_timeout", DEFAULT_RENDEZVOUS_TIMEOUT),
        isolate=isolate,
    )


# -- N processes: fork and supervise -----------------------------------------------------------


class _ForkedLaunch:
    """One multi-process launch: ``start``, a wait loop over ``supervisor``, then ``finish``."""

    def __init__(
        self,
        call: Call,
        plan: LaunchPlan,
        observer: LaunchObserver,
        kernel_models: dict[int, Any],
        restart_count: int,
    ) -> None:
        self.call = call
        self.restart_count = restart_count
        self.plan = plan
        self.observer = observer
        self.stop_flag = StopFlag()
        self.supervisor = Supervisor([], observer)
        self.kernel_models = kernel_models
        self._started: float | None = None  # set once the observer has been told

    def start(self) -> None:
        """Tell the observer, fork every worker.

        Ctrl-C is held until the guardian is known, so nothing forked escapes the cleanup.
        """
        with (
            interrupts_deferred(),
            open_listener(self.plan) or contextlib.nullcontext() as listener,
        ):
            ranks = tuple(self.plan.global_rank(i) for i in range(self.plan.num_processes))
            info = LaunchInfo(
                self.plan.banner(),
                self.plan.num_processes,
                self.plan.world_size,
                ranks,
                self.stop_flag,
            )
            self.observer.on_start(info)
            self._started = time.monotonic()
            self.supervisor.guardian = fork_workers(
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
        try:
            if self._started is not None:
                self.observer.on_finish(self._summary(outcome, error, self._started))
        finally:
            with interrupts_deferred():
                self.supervisor.release()  # the guardian's exit overlapped with on_finish
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

    def _summary(self, outcome: Any, error: BaseException | None, started: float) -> LaunchSummary:
        return LaunchSummary(
            ranks=self.supervisor.rank_summaries(),
            duration=time.monotonic() - started,
            failures=tuple(outcome.failures),
            timed_out=outcome.timed_out,
            interrupted=isinstance(error, (KeyboardInterrupt, asyncio.CancelledError)),
            stopped=self.stop_flag.is_set(),
            error=error,
        )
