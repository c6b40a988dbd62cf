"""Forking the workers: one pipe set per worker, descriptors closed on the right side."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import sys
import warnings

# Workers build an Accelerator; loading it here, in the kernel, lets every forked worker
# inherit the module instead of importing it again at each launch.
import notebook_kit.accelerator  # noqa: F401
from notebook_kit.config.launch_plan import LOOPBACK, LaunchPlan
from notebook_kit.launch.plan import Call
from notebook_kit.launch.preflight import open_rendezvous_socket
from notebook_kit.launch.supervisor import LineReader, WorkerProcess
from notebook_kit.runtime.context import StopFlag
from notebook_kit.worker.entry import run_worker
from notebook_kit.worker.spec import WorkerPipes, WorkerSpec

__all__ = ["fork_workers", "open_listener"]


def open_listener(plan: LaunchPlan) -> socket.socket | None:
    """Node 0 listens for the rendezvous: on loopback only when the job has one node."""
    if plan.node_rank != 0:
        return None
    host = LOOPBACK if plan.num_nodes == 1 else ""
    return open_rendezvous_socket(host, plan.port)


def fork_workers(
    call: Call,
    plan: LaunchPlan,
    listener: socket.socket | None,
    stop_flag: StopFlag,
    home_model_ids: frozenset[int],
    workers: list[WorkerProcess],
    restart_count: int,
) -> None:
    """Fork ``plan.num_processes`` workers, appending each to ``workers`` as it starts.

    Appending one by one lets the caller stop the ones already running if a fork fails.
    """
    # Without a listener this node joins another's store: a multi-node plan always has a port.
    port = listener.getsockname()[1] if listener else plan.port
    assert port is not None
    for local_rank in range(plan.num_processes):
        serves_store = listener is not None and local_rank == 0
        spec = WorkerSpec(
            plan=plan,
            local_rank=local_rank,
            master_port=port,
            listen_fd=listener.fileno() if serves_store else None,
            home_model_ids=home_model_ids,
            restart_count=restart_count,
        )
        also_close = (listener.fileno(),) if listener is not None and not serves_store else ()
        workers.append(_fork_worker(call, spec, stop_flag, workers, also_close))


def _fork_worker(
    call: Call,
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
        run_worker(*call, spec, pipes, stop_flag)
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
