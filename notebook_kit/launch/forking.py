"""Forking a launch: the guardian, which forks the workers, and every pipe between them.

The kernel forks one process, the guardian (:mod:`notebook_kit.worker.guardian`), which
forks the workers and outlives them, so that nothing a worker starts can outlive the launch.
All pipes are made here first, so each side closes exactly the ends it does not use.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import multiprocessing
import os
import secrets
import socket
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

# Workers build an Accelerator; loading it here, in the kernel, lets every forked worker
# inherit the module instead of importing it again at each launch.
import notebook_kit.accelerator  # noqa: F401
from notebook_kit.config.launch_plan import LOOPBACK, LaunchPlan
from notebook_kit.launch.guardian_link import GuardianLink
from notebook_kit.launch.interrupts import forking
from notebook_kit.launch.line_reader import LineReader
from notebook_kit.launch.plan import Call
from notebook_kit.launch.preflight import open_rendezvous_socket
from notebook_kit.launch.supervisor import WorkerProcess
from notebook_kit.runtime.context import StopFlag
from notebook_kit.worker.debugger import break_ranks
from notebook_kit.worker.guardian import GuardianPipes, WorkerStart, run_guardian
from notebook_kit.worker.spec import WorkerPipes, WorkerSpec

__all__ = ["NodeSeat", "fork_workers", "open_listener"]


@dataclass
class NodeSeat:
    """One node's place in a run whose nodes were started by something else (a Dask task).

    ``listener`` is node 0's rendezvous socket, bound by the node itself before its address
    was published, so no other process can take the port in between; ``store_prefix`` is the
    secret every node got inside its task (never through the environment). ``weights`` is
    filled with what rank 0 sent home, keyed by the model ids of this process.
    """

    store_prefix: str
    listener: socket.socket | None = None
    weights: dict[int, Any] = field(default_factory=dict)


def open_listener(plan: LaunchPlan, seat: NodeSeat | None = None) -> socket.socket | None:
    """Node 0 listens for the rendezvous: on loopback for one node, else on ``master_addr``."""
    if plan.node_rank != 0:
        return None
    if seat is not None and seat.listener is not None:
        listener, seat.listener = seat.listener, None  # served by this attempt only
        return listener
    host = LOOPBACK if plan.num_nodes == 1 else plan.master_addr
    try:
        return open_rendezvous_socket(host, plan.port)
    except OSError as error:
        if error.errno != errno.EADDRNOTAVAIL:
            raise
        raise OSError(
            error.errno,
            f"master_addr={host!r} is not an address of this machine, so node 0 "
            f"(node_rank=0) cannot listen on it. Run node_rank=0 on the machine that "
            f"master_addr names, or set master_addr to an address of this machine that the "
            f"other nodes can reach.",
        ) from error


def fork_workers(
    call: Call,
    plan: LaunchPlan,
    listener: socket.socket | None,
    stop_flag: StopFlag,
    home_model_ids: frozenset[int],
    workers: list[WorkerProcess],
    restart_count: int,
    seat: NodeSeat | None = None,
    weights_fd: int | None = None,
) -> GuardianLink:
    """Fork the guardian, which forks ``plan.num_processes`` workers; one handle per worker is
    appended to ``workers`` first, so the caller can close every pipe if forking fails.
    ``weights_fd`` is the kernel's weights file, where rank 0 writes the trained weights.
    """
    break_ranks()  # each rank reads NOTEBOOK_KIT_BREAK_RANKS: a bad value is refused here, first
    # Without a listener this node joins another's store: a multi-node plan always has a port.
    port = listener.getsockname()[1] if listener else plan.port
    assert port is not None
    prefix = seat.store_prefix if seat is not None else _store_prefix(plan)
    control_read, control_write = os.pipe()
    status_read, status_write = os.pipe()
    write_ends = []
    for local_rank in range(plan.num_processes):
        handle, ends = _worker_pipes(plan.global_rank(local_rank))
        workers.append(handle)
        write_ends.append(ends)
    listener_fd = listener.fileno() if listener is not None else None
    starts = []
    for local_rank, (stdout_fd, stderr_fd, messages, answers) in enumerate(write_ends):
        serves_store = listener_fd is not None and local_rank == 0
        spec = WorkerSpec(
            plan=plan,
            local_rank=local_rank,
            master_port=port,
            listen_fd=listener_fd if serves_store else None,
            home_model_ids=home_model_ids,
            restart_count=restart_count,
            store_prefix=prefix,
            weights_fd=weights_fd,
        )
        # A worker closes the guardian's pipes, the listener unless it serves the store, and
        # the write ends of the workers forked after it (the guardian closes earlier ones).
        closes = [control_read, status_write]
        closes += [listener_fd] if listener_fd is not None and not serves_store else []
        closes += [fd for later in write_ends[local_rank + 1 :] for fd in _fds(later)]
        pipes = WorkerPipes(stdout_fd, stderr_fd, messages, tuple(closes), answers)
        starts.append(WorkerStart(spec, pipes))
    kernel_fds = [control_write, status_read]
    kernel_fds += [fd for worker in workers for fd in (worker.stdout.fd, worker.stderr.fd)]
    pipes = GuardianPipes(
        control=control_read,
        status=status_write,
        kernel_fds=tuple(kernel_fds),
        kernel_connections=tuple(
            end for worker in workers for end in (worker.messages, worker.answers) if end
        ),
        listener=listener_fd,
    )
    pid = _fork_guardian(call, starts, stop_flag, pipes, (control_write, status_read))
    os.set_blocking(status_read, False)
    return GuardianLink(pid, control_write, status_read)


def _store_prefix(plan: LaunchPlan) -> str:
    """One node: a secret per launch. Several: every node must agree without talking first."""
    if plan.num_nodes == 1:
        return f"notebook_kit/{secrets.token_hex(16)}/"
    return "notebook_kit/"


# stdout, stderr, messages, and the read end of the lines typed at its pdb: the worker's side
WriteEnds = tuple[int, int, Connection, Connection]


def _worker_pipes(rank: int) -> tuple[WorkerProcess, WriteEnds]:
    stdout_read, stdout_write = os.pipe()
    stderr_read, stderr_write = os.pipe()
    messages_read, messages_write = multiprocessing.Pipe(duplex=False)
    answers_read, answers_write = multiprocessing.Pipe(duplex=False)
    for fd in (stdout_read, stderr_read):
        os.set_blocking(fd, False)
    handle = WorkerProcess(
        rank=rank,
        pid=0,
        stdout=LineReader(stdout_read, rank, "stdout"),
        stderr=LineReader(stderr_read, rank, "stderr"),
        messages=messages_read,
        answers=answers_write,
    )
    return handle, (stdout_write, stderr_write, messages_write, answers_read)


def _fds(ends: WriteEnds) -> tuple[int, int, int, int]:
    return ends[0], ends[1], ends[2].fileno(), ends[3].fileno()


@contextlib.contextmanager
def _kernel_objects_frozen() -> Iterator[None]:
    """Around the fork: the kernel's objects are moved out of the garbage collector's reach.

    A forked process inherits every object of the kernel (torch, the notebook's data), and
    each collection there walks them, which takes milliseconds and writes to their pages, so
    copy-on-write duplicates memory the workers would otherwise share. Frozen at the fork, the
    workers never walk them; the kernel unfreezes its own, so its collector is as before.
    """
    gc.freeze()
    parent = os.getpid()
    try:
        yield
    finally:
        if os.getpid() == parent:
            gc.unfreeze()


def _fork_guardian(
    call: Call,
    starts: list[WorkerStart],
    stop_flag: StopFlag,
    pipes: GuardianPipes,
    kernel_ends: tuple[int, int],
) -> int:
    """Fork the guardian; the kernel then closes every end that belongs to the other side."""
    kernel_pid = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        with warnings.catch_warnings(), forking(), _kernel_objects_frozen():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a threaded kernel
            pid = os.fork()
        if pid == 0:
            run_guardian(call, starts, stop_flag, pipes, kernel_pid)
    except BaseException:
        for fd in kernel_ends:
            os.close(fd)
        raise
    finally:
        for fd in (pipes.control, pipes.status):
            os.close(fd)
        for start in starts:
            os.close(start.pipes.stdout_fd)
            os.close(start.pipes.stderr_fd)
            start.pipes.messages.close()
            if start.pipes.answers is not None:
                start.pipes.answers.close()
    with contextlib.suppress(OSError):  # the guardian does it too; whichever comes first
        os.setpgid(pid, pid)
    return pid
