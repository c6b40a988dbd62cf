"""``notebook_launcher``: run a training function on N forked processes from a notebook."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from notebook_kit import arguments
from notebook_kit.console import ConsolePrinter
from notebook_kit.errors import WorkerError
from notebook_kit.homecoming import find_kernel_models, load_home_weights
from notebook_kit.preflight import check_fork_safety, open_rendezvous_socket, probe_kernel
from notebook_kit.runtime import LaunchContext, StopFlag, active_launch
from notebook_kit.supervisor import (
    LaunchObserver,
    LineReader,
    Supervisor,
    WorkerProcess,
    interrupts_deferred,
)
from notebook_kit.worker import WorkerPipes, WorkerSpec, run_worker

__all__ = ["notebook_launcher"]

DEFAULT_MULTI_NODE_PORT = 29500
_LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LaunchPlan:
    """The validated, resolved shape of one launch on this node."""

    num_processes: int
    num_nodes: int
    node_rank: int
    master_addr: str
    port: int | None
    backend: str
    threads: int
    mixed_precision: str | None
    gradient_accumulation_steps: int | None
    rendezvous_timeout: float

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_nodes

    def banner(self) -> str:
        where = "CPU" if self.backend == "gloo" else f"{self.num_processes} GPUs"
        noun = "process" if self.num_processes == 1 else "processes"
        text = f"Launching {self.num_processes} {noun} on {where} ({self.backend})"
        if self.num_nodes > 1:
            text += f", node {self.node_rank} of {self.num_nodes}, world size {self.world_size}"
        threads = "thread" if self.threads == 1 else "threads"
        return f"{text}, {self.threads} {threads} each"


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    mixed_precision: arguments.MixedPrecision | None = None,
    use_port: int | None = None,
    master_addr: str = _LOOPBACK,
    node_rank: int = 0,
    num_nodes: int = 1,
    backend: arguments.Backend | None = None,
    threads_per_process: int | None = None,
    timeout: float | None = None,
    gradient_accumulation_steps: int | None = None,
    rendezvous_timeout: float = 300.0,
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
        observer: Receives worker output and messages; default: rank-prefixed lines.

    Returns:
        What ``function`` returned on rank 0.

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
    function = arguments.check_function(function)
    args, kwargs = arguments.check_args(args, kwargs)
    observer = observer or ConsolePrinter()
    plan = _plan(
        num_processes,
        mixed_precision,
        use_port,
        master_addr,
        node_rank,
        num_nodes,
        backend,
        threads_per_process,
        gradient_accumulation_steps,
        rendezvous_timeout,
    )
    timeout = arguments.check_timeout(timeout)
    if plan.num_processes == 1 and plan.num_nodes == 1:
        return _run_in_process(function, args, kwargs, plan, observer)
    return _run_forked(function, args, kwargs, plan, observer, timeout)


def _plan(
    num_processes: Any,
    mixed_precision: Any,
    use_port: Any,
    master_addr: Any,
    node_rank: Any,
    num_nodes: Any,
    backend: Any,
    threads_per_process: Any,
    gradient_accumulation_steps: Any,
    rendezvous_timeout: Any,
) -> LaunchPlan:
    """Validate every argument and resolve the defaults (before anything is forked)."""
    num_nodes, node_rank = arguments.check_nodes(num_nodes, node_rank)
    num_processes = arguments.check_optional_int("num_processes", num_processes, minimum=1)
    mixed_precision = arguments.check_optional_choice(
        "mixed_precision", mixed_precision, arguments.MIXED_PRECISION_CHOICES
    )
    port = arguments.check_optional_int("use_port", use_port, minimum=1, maximum=65535)
    master_addr = arguments.check_master_addr(master_addr)
    backend = arguments.check_optional_choice("backend", backend, arguments.BACKEND_CHOICES)
    threads = arguments.check_optional_int("threads_per_process", threads_per_process, minimum=1)
    accumulation = arguments.check_optional_int(
        "gradient_accumulation_steps", gradient_accumulation_steps, minimum=1
    )
    rendezvous_timeout = arguments.check_timeout(rendezvous_timeout) or 300.0
    gpus = _visible_gpus() if num_processes is None or backend in (None, "nccl") else 0
    if num_processes is None:
        num_processes = max(gpus, 1)
    if backend is None:
        backend = "nccl" if gpus >= num_processes and num_processes > 1 else "gloo"
    elif backend == "nccl" and gpus < num_processes:
        raise ValueError(
            f"backend='nccl' needs one GPU per process, but {gpus} GPUs are visible for "
            f"num_processes={num_processes}. Use backend='gloo' or fewer processes."
        )
    if num_nodes > 1 and port is None:
        port = DEFAULT_MULTI_NODE_PORT
    return LaunchPlan(
        num_processes=num_processes,
        num_nodes=num_nodes,
        node_rank=node_rank,
        master_addr=master_addr if num_nodes > 1 else _LOOPBACK,
        port=port,
        backend=backend,
        threads=threads or max(1, _usable_cores() // num_processes),
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=accumulation,
        rendezvous_timeout=rendezvous_timeout,
    )


def _visible_gpus() -> int:
    """GPUs a worker would see, counted without initialising CUDA in the kernel."""
    return probe_kernel().cuda_devices


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# -- one process: run in the kernel ------------------------------------------------------------


def _run_in_process(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    plan: LaunchPlan,
    observer: LaunchObserver,
) -> Any:
    """Run in the calling process (debuggable), with a world-size-1 gloo group around it."""
    context = LaunchContext(
        backend="gloo",
        mixed_precision=plan.mixed_precision,
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        send=lambda kind, payload: observer.on_message(0, kind, payload),
        stop_flag=StopFlag(),
    )
    environment = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    try:
        with _temporary_environment(environment), _single_process_group(), active_launch(context):
            return function(*args, **kwargs)
    finally:
        context.stop_flag.close()


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


@contextlib.contextmanager
def _single_process_group() -> Iterator[None]:
    """A gloo group of one on an in-memory store, unless the caller already has a group."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# -- N processes: fork and supervise -----------------------------------------------------------


def _run_forked(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    plan: LaunchPlan,
    observer: LaunchObserver,
    timeout: float | None,
) -> Any:
    check_fork_safety()
    kernel_models = find_kernel_models(function, args, kwargs)
    listener = _open_listener(plan)
    stop_flag = StopFlag()
    workers: list[WorkerProcess] = []
    supervisor = Supervisor(workers, observer)
    print(plan.banner(), flush=True)
    try:
        with listener or contextlib.nullcontext():
            port = listener.getsockname()[1] if listener else plan.port
            specs = _worker_specs(plan, port, listener, frozenset(kernel_models))
            listener_fds = (listener.fileno(),) if listener else ()
            for spec in specs:
                also_close = () if spec.listen_fd is not None else listener_fds
                workers.append(
                    _fork_worker(function, args, kwargs, spec, stop_flag, workers, also_close)
                )
        outcome = supervisor.run(timeout)
    finally:
        with interrupts_deferred():
            supervisor.shutdown()
            stop_flag.close()
    if outcome.timed_out:
        raise TimeoutError(
            f"The launch did not finish within timeout={timeout} s; all "
            f"{plan.num_processes} workers were stopped. Raise timeout or pass None."
        )
    if outcome.failures:
        raise WorkerError(outcome.failures, plan.world_size)
    result = outcome.result or {}
    load_home_weights(kernel_models, result.get("weights", {}))
    return result.get("value")


def _open_listener(plan: LaunchPlan) -> socket.socket | None:
    """Node 0 listens for the rendezvous: on loopback only when the job has one node."""
    if plan.node_rank != 0:
        return None
    host = _LOOPBACK if plan.num_nodes == 1 else ""
    return open_rendezvous_socket(host, plan.port)


def _worker_specs(
    plan: LaunchPlan, port: int | None, listener: socket.socket | None, home: frozenset[int]
) -> list[WorkerSpec]:
    return [
        WorkerSpec(
            rank=plan.node_rank * plan.num_processes + local_rank,
            local_rank=local_rank,
            world_size=plan.world_size,
            local_world_size=plan.num_processes,
            node_rank=plan.node_rank,
            num_nodes=plan.num_nodes,
            master_addr=plan.master_addr,
            master_port=int(port or DEFAULT_MULTI_NODE_PORT),
            backend=plan.backend,
            threads=plan.threads,
            mixed_precision=plan.mixed_precision,
            gradient_accumulation_steps=plan.gradient_accumulation_steps,
            rendezvous_timeout=plan.rendezvous_timeout,
            listen_fd=listener.fileno() if listener and local_rank == 0 else None,
            home_model_ids=home,
        )
        for local_rank in range(plan.num_processes)
    ]


def _fork_worker(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    spec: WorkerSpec,
    stop_flag: StopFlag,
    earlier: list[WorkerProcess],
    also_close: tuple[int, ...],
) -> WorkerProcess:
    """Fork one worker; the child closes every kernel-side descriptor it inherited."""
    stdout_read, stdout_write = os.pipe()
    stderr_read, stderr_write = os.pipe()
    messages_read, messages_write = multiprocessing.Pipe(duplex=False)
    inherited = [stdout_read, stderr_read, messages_read.fileno(), *also_close]
    for worker in earlier:
        inherited += [obj if isinstance(obj, int) else obj.fileno() for obj in worker.waitables()]
    pipes = WorkerPipes(stdout_write, stderr_write, messages_write, tuple(inherited))
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a threaded kernel
        pid = os.fork()
    if pid == 0:
        run_worker(function, args, kwargs, spec, pipes, stop_flag)
    os.close(stdout_write)
    os.close(stderr_write)
    messages_write.close()
    for fd in (stdout_read, stderr_read):
        os.set_blocking(fd, False)
    return WorkerProcess(
        rank=spec.rank,
        pid=pid,
        stdout=LineReader(stdout_read, spec.rank, "stdout"),
        stderr=LineReader(stderr_read, spec.rank, "stderr"),
        messages=messages_read,
        pidfd=_pidfd(pid),
    )


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when the process exits (Linux 5.3+)."""
    with contextlib.suppress(AttributeError, OSError):
        return os.pidfd_open(pid)
    return None


if not torch.distributed.is_available():  # pragma: no cover - torch built without distributed
    warnings.warn("torch.distributed is not available: only num_processes=1 works.", stacklevel=1)
