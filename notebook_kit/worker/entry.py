"""The code that runs in a forked worker: environment, process group, the user's function.

Everything here runs after ``os.fork()`` in the child. The child never returns into the
kernel's code: it always leaves through ``os._exit``, so no kernel cleanup runs twice.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import io
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import process, util
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import torch

from notebook_kit.config.launch_plan import worker_environment
from notebook_kit.runtime import messages
from notebook_kit.runtime.context import LaunchContext, StopFlag, active_launch
from notebook_kit.runtime.messages import Failure, Finished, Result, Send, WorkerMessage, weights_of
from notebook_kit.runtime.seeding import set_seed
from notebook_kit.runtime.weights_file import gather_and_store, store_home_weights
from notebook_kit.worker.debugger import install_debugger, post_mortem, worth_a_post_mortem
from notebook_kit.worker.host_pickling import dumps_for_kernel
from notebook_kit.worker.memory_history import recording_memory, run_folder
from notebook_kit.worker.rendezvous import join_process_group, leave_process_group
from notebook_kit.worker.spec import WorkerPipes, WorkerSpec
from notebook_kit.worker.stacks import answer_stack_requests
from notebook_kit.worker.step_profiler import answer_profile_requests

_PR_SET_PDEATHSIG = 1


def run_worker(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    spec: WorkerSpec,
    pipes: WorkerPipes,
    stop_flag: StopFlag,
    parent_pid: int,
) -> NoReturn:
    """Entry point of a forked worker (a child of the launch's guardian); never returns."""
    exit_code = 1
    try:
        _detach_from_kernel(pipes, parent_pid)
        signal.signal(signal.SIGTERM, _sigterm_handler(stop_flag))
        send = _message_sender(pipes.messages)
        answer_stack_requests(send)  # where this rank waits, if the run ever stalls
        answer_profile_requests(send)  # notebook_kit.profile(): the next steps profiled
        if pipes.answers is not None:  # breakpoint() opens pdb in the kernel's cell
            install_debugger(spec.rank, send, pipes.answers)
        exit_code = _run(function, args, kwargs, spec, send, stop_flag)
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            # As a multiprocessing child ends: flush what its queues buffer, join its children.
            util._exit_function()
        exit_flushed(exit_code)


def exit_flushed(status: int) -> NoReturn:
    """End this process with ``status`` at once, its standard streams flushed first: ``os._exit``
    runs no clean-up, so what they buffer would be lost."""
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


def _detach_from_kernel(pipes: WorkerPipes, parent_pid: int) -> None:
    """Leave the kernel's signal handling, output streams and descriptors behind."""
    os.setpgid(0, 0)  # own process group: the launcher can stop this worker and its children
    _die_with_parent(parent_pid)
    _reset_multiprocessing()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for fd in pipes.inherited_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _redirect_output(pipes.stdout_fd, pipes.stderr_fd)


def _sigterm_handler(stop_flag: StopFlag) -> Callable[[int, Any], None]:
    """SIGTERM from the launch (it is ending its workers) ends this worker, as SIGTERM ends a
    process. From anywhere else it means the machine is going away (a preempted VM's
    shutdown, a SLURM job at its limit): the stop flag is marked preempted, and the ranks'
    stop vote ends the run at one step, so the function can save first. The function may
    install its own handler instead."""

    def handle(signum: int, frame: Any) -> None:
        if stop_flag.ending:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            stop_flag.preempt()

    return handle


def _reset_multiprocessing() -> None:
    """Do what multiprocessing does in a child it forks itself.

    A ``multiprocessing.Queue`` (or lock, pool, manager proxy) made in the kernel is copied
    into this worker as it was at the fork, its internal lock possibly held by a thread that
    does not exist here: a ``put()`` would wait for ever. Its after-fork handler resets it,
    and the kernel's finalizers are not this process's to run. Nor are the kernel's own
    children this worker's: multiprocessing's exit function would terminate them (a Dask
    ``LocalCluster``'s worker processes, for one) when the worker ends.
    """
    process._children = set()
    util._finalizer_registry.clear()
    util._run_after_forkers()


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill this worker if the launch's guardian dies, so no orphan keeps training."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the guardian died before prctl took effect
        os._exit(1)


def _redirect_output(stdout_fd: int, stderr_fd: int) -> None:
    """Send fd 1/2 and Python's streams into the pipes the kernel reads line by line.

    Streams are unbuffered (write-through), so nothing printed is lost if the worker crashes.
    """
    old_streams = (sys.stdout, sys.stderr)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    os.close(stdout_fd)
    os.close(stderr_fd)
    sys.stdout = sys.__stdout__ = _unbuffered_text_stream(1)
    sys.stderr = sys.__stderr__ = _unbuffered_text_stream(2)
    loggers = [logging.root, *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):  # placeholders have none
            if isinstance(handler, logging.StreamHandler) and handler.stream in old_streams:
                handler.setStream(sys.stderr if handler.stream is old_streams[1] else sys.stdout)


def _unbuffered_text_stream(fd: int) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(
        raw, encoding="utf-8", errors="backslashreplace", line_buffering=True, write_through=True
    )


def _message_sender(connection: Connection) -> Send:
    lock = threading.Lock()

    def send(message: WorkerMessage) -> None:
        data = messages.encode(message, dumps_for_kernel)  # tensors arrive on the CPU
        with lock:
            connection.send_bytes(data)

    return send


def _run(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    spec: WorkerSpec,
    send: Send,
    stop_flag: StopFlag,
) -> int:
    _set_environment(spec)
    torch.set_num_threads(spec.plan.threads)
    if spec.plan.seed is not None:
        set_seed(spec.plan.seed)
    context = LaunchContext(
        rank=spec.rank,
        local_rank=spec.local_rank,
        world_size=spec.plan.world_size,
        local_world_size=spec.plan.num_processes,
        node_rank=spec.plan.node_rank,
        num_nodes=spec.plan.num_nodes,
        backend=spec.plan.backend,
        device=spec.plan.device,
        mixed_precision=spec.plan.mixed_precision,
        gradient_accumulation_steps=spec.plan.gradient_accumulation_steps,
        storage_timeout=spec.plan.storage_timeout,
        send=send,
        stop_flag=stop_flag,
        restart_count=spec.restart_count,
    )
    store = None
    ended = "returned"
    stored: dict[int, dict[str, Any]] | None = None
    try:
        store = join_process_group(spec)
        with active_launch(context):
            try:
                # On this process's main thread (the guardian forked it from a fresh one),
                # so the function may install signal handlers.
                with _memory_recorded(spec):
                    value = function(*args, **kwargs)
                # Every rank forked here writes to (or joins) the kernel's file; across nodes
                # each node's ranks gather through the strategy's gatherer, so the
                # collectives of every node match.
                if spec.weights_fd is not None and spec.plan.num_nodes == 1:
                    stored = _gather_and_store(spec, context)
                else:
                    context.gather_weights(spec.home_model_ids)  # sharded models: all ranks
            finally:
                context.close()  # what is still buffered (metrics) reaches the kernel
    except SystemExit as exit_request:
        if exit_request.code not in (None, 0):
            return _report_exception(send, spec.rank, context.mesh_coordinates)
        value, ended = None, f"called sys.exit({exit_request.code!r})"
    except BaseException as error:
        if spec.plan.post_mortem and worth_a_post_mortem(error):  # before the kernel hears
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C at the prompt: the run ends
                post_mortem(error)
        return _report_exception(send, spec.rank, context.mesh_coordinates)
    if not _report_result(send, spec, context, value, ended, stored):
        return 1
    try:
        if store is not None:
            leave_process_group(store, spec)
    except BaseException:
        return _report_exception(send, spec.rank)
    return 0


def _memory_recorded(spec: WorkerSpec) -> contextlib.AbstractContextManager[None]:
    """``memory_history=True``: this GPU rank records its allocator while the function runs
    (a pool's commands included), its snapshots in a folder of the launch's guardian."""
    folder = run_folder(f"launch-{os.getppid()}")
    return recording_memory(spec.plan.memory_history, spec.rank, spec.plan.device, folder)


def _set_environment(spec: WorkerSpec) -> None:
    """This rank's place in the run, and what every worker of a launch is given."""
    os.environ.update(
        RANK=str(spec.rank),
        LOCAL_RANK=str(spec.local_rank),
        WORLD_SIZE=str(spec.plan.world_size),
        LOCAL_WORLD_SIZE=str(spec.plan.num_processes),
        NODE_RANK=str(spec.plan.node_rank),
        GROUP_RANK=str(spec.plan.node_rank),
        MASTER_ADDR=spec.plan.master_addr,
        MASTER_PORT=str(spec.master_port),
        NOTEBOOK_KIT_RESTART_COUNT=str(spec.restart_count),
        **worker_environment(spec.plan, spec.plan.threads),
    )


def _report_exception(send: Send, rank: int, mesh: str = "") -> int:
    """Send the exception to the kernel, which shows it once; print it only if that fails.

    ``mesh``: the rank's device-mesh coordinates, named beside its rank.
    """
    _, error, trace = sys.exc_info()
    # Skip this module's own frames: the traceback starts in the user's function.
    failure = dataclasses.replace(Failure.from_exception(error, trace, [__file__]), mesh=mesh)
    try:
        send(failure)
    except BaseException:
        with contextlib.suppress(BaseException):
            sys.stderr.write(f"rank {rank}: {failure.traceback}")
    return 1


def _report_result(
    send: Send,
    spec: WorkerSpec,
    context: LaunchContext,
    value: Any,
    ended: str,
    stored: dict[int, dict[str, Any]] | None = None,
) -> bool:
    """Each node's local rank 0 sends its value and the trained weights of kernel models home.

    Every rank says how and when its function ended, so a rank that left while the others
    still needed it can be named when they fail for want of it.
    """
    if spec.local_rank != 0:
        send(Finished(ended, time.monotonic()))
        return True
    # Forked: a model the kernel holds has the same id here.
    home = {i: i for i in spec.home_model_ids}
    weights = stored
    if weights is None and spec.weights_fd is not None:  # the kernel's file, tensor by tensor
        try:
            weights = store_home_weights(
                spec.weights_fd, context.prepared_models, home, context.gathered_weights
            )
        except Exception:  # a model's state_dict raised: the kernel shows it as rank 0's error
            _report_exception(send, spec.rank)
            return False
    try:
        if weights is None:
            weights = weights_of(context.prepared_models, home, context.gathered_weights)
        send(Result(value, weights, ended))
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        message = (
            f"rank 0 returned a value of type {type(value).__module__}.{type(value).__qualname__} "
            f"that cannot be pickled back to the kernel ({error}). Return plain data, tensors or "
            f"a state_dict instead."
        )
        send(Failure("ResultError", message, ""))
        return False
    return True


def _gather_and_store(spec: WorkerSpec, context: LaunchContext) -> dict[int, dict[str, Any]]:
    """Sharded models gathered one tensor at a time on every rank; rank 0 writes each one to
    the kernel's file, so it never holds a second whole model."""
    home = {i: i for i in spec.home_model_ids}
    fd = spec.weights_fd if spec.rank == 0 else None
    sharded = context.weight_gatherers.__contains__
    return gather_and_store(fd, context.prepared_models, home, lambda model: sharded(id(model)))
