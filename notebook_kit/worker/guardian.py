"""The launch's guardian: the one process the kernel forks, parent of every worker.

It makes sure that no process started during a launch outlives it, however the launch ends:

- It is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process below it that loses its
  parent is re-parented to it, however it detached (a new session, a double fork), so it
  always finds every descendant.
- It sits in a process group of its own, so a signal sent to the kernel's group never reaches
  it, and it learns of the kernel's death from its control pipe closing (plus its parent pid
  changing, in case a later fork of the kernel kept the pipe open).
- It forks the workers from a fresh thread, which becomes each worker's main thread: the
  function can install signal handlers, and GNU OpenMP (torch's CPU thread pool), which keeps
  its pool per thread, starts a new one instead of waiting for the kernel's missing threads.
  That thread lives as long as the guardian, since a worker's parent-death signal fires when
  the thread that forked it ends.

When a worker exits, its process group is killed and its exit status sent to the kernel. On
``STOP``, SIGHUP or when the kernel is gone: the stop flag marked as the launch ending its
workers, SIGTERM to every worker's group, a grace period, then SIGKILL to every descendant
until none is left; then it exits. It also exits as soon as every worker has ended and it has
no child left, since then nothing can be left below it. SIGTERM from outside (a preempted
VM's shutdown, a SLURM job at its limit: every process gets it) does not stop the launch: it
marks the stop flag preempted, so the ranks can save before the machine goes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from notebook_kit.worker.descendants import descendants
from notebook_kit.worker.entry import run_worker
from notebook_kit.worker.spec import WorkerPipes, WorkerSpec
from notebook_kit.worker.stacks import STACKS_SIGNAL
from notebook_kit.worker.step_profiler import PROFILE_SIGNAL

__all__ = [
    "EXITED",
    "NOT_STARTED",
    "RECORD",
    "STARTED",
    "STOP",
    "TERMINATE_GRACE_SECONDS",
    "GuardianPipes",
    "WorkerStart",
    "run_guardian",
]

# One record per event, guardian -> kernel: rank, event, value, time.monotonic().
RECORD = struct.Struct("<iiqd")
STARTED = 1  # value: the worker's pid
EXITED = 2  # value: exit code, negative for a signal
NOT_STARTED = 3  # value: errno of the failed fork
STOP = b"S"  # kernel -> guardian: stop the workers, sweep, exit
# How long workers get between SIGTERM and SIGKILL.
TERMINATE_GRACE_SECONDS = 0.5
# How often the guardian checks that the kernel is still its parent.
_KERNEL_CHECK_SECONDS = 0.5
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class GuardianPipes:
    """The guardian's ends of its pipes, and the kernel's ends it must close."""

    control: int  # read end: STOP from the kernel; end of file once the kernel is gone
    status: int  # write end: records for the kernel
    kernel_fds: tuple[int, ...]
    kernel_connections: tuple[Connection, ...]
    listener: int | None  # the rendezvous socket: rank 0 keeps it, the guardian closes it


@dataclass(frozen=True)
class WorkerStart:
    """What the guardian needs to fork one worker."""

    spec: WorkerSpec
    pipes: WorkerPipes


Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def run_guardian(
    call: Call, starts: list[WorkerStart], stop_flag: Any, pipes: GuardianPipes, kernel_pid: int
) -> NoReturn:
    """Entry point of the guardian, right after the kernel forked it; never returns."""
    try:
        _detach_from_kernel(pipes)
        workers = _fork_on_fresh_thread(call, starts, stop_flag, pipes.status)
        if pipes.listener is not None:
            os.close(pipes.listener)
        _Guardian(pipes, workers, kernel_pid, stop_flag).run()
    finally:
        # Everything below is gone: tell the kernel now, not after this process's memory is
        # unmapped (which takes milliseconds for a copy of a big kernel).
        with contextlib.suppress(OSError):
            os.close(pipes.status)
        os._exit(0)


def _detach_from_kernel(pipes: GuardianPipes) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel handles interrupts and tells us
    # The kernel's event loop may have a wake-up descriptor for signals: a copy of it here,
    # or in the workers forked from here, would send their signals to the kernel's loop.
    signal.set_wakeup_fd(-1)
    os.setpgid(0, 0)  # out of the kernel's group: a signal to it must not reach us
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    for fd in pipes.kernel_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    for connection in pipes.kernel_connections:
        with contextlib.suppress(OSError):
            connection.close()


def _fork_on_fresh_thread(
    call: Call, starts: list[WorkerStart], stop_flag: Any, status: int
) -> dict[int, int]:
    """Fork every worker from a new thread that then waits for the guardian's exit."""
    forked: dict[int, int] = {}
    done = threading.Event()
    guardian_pid = os.getpid()

    def fork_all() -> None:
        # A child starts with its forking thread's mask: a request for stacks that comes before
        # the worker's answering thread is there waits for it, instead of killing the worker.
        signal.pthread_sigmask(signal.SIG_BLOCK, {STACKS_SIGNAL, PROFILE_SIGNAL})
        try:
            for start in starts:
                pid = _fork_worker(call, start, stop_flag, status, guardian_pid)
                if pid is not None:
                    forked[pid] = start.spec.rank
        finally:
            done.set()
        threading.Event().wait()

    threading.Thread(target=fork_all, name="notebook_kit-forker", daemon=True).start()
    done.wait()
    return forked


def _fork_worker(
    call: Call, start: WorkerStart, stop_flag: Any, status: int, guardian_pid: int
) -> int | None:
    rank, pipes = start.spec.rank, start.pipes
    try:
        pid = os.fork()
    except OSError as error:
        _send(status, rank, NOT_STARTED, error.errno or 0)
        pid = None
    if pid == 0:
        run_worker(*call, start.spec, pipes, stop_flag, guardian_pid)
    if pid is not None:
        _send(status, rank, STARTED, pid)
    # Later workers must not inherit this one's write ends.
    os.close(pipes.stdout_fd)
    os.close(pipes.stderr_fd)
    pipes.messages.close()
    if pipes.answers is not None:
        pipes.answers.close()
    return pid


def _send(status: int, rank: int, event: int, value: int) -> None:
    with contextlib.suppress(OSError):  # the kernel is gone: nobody to tell
        os.write(status, RECORD.pack(rank, event, value, time.monotonic()))


class _Guardian:
    """The guardian's loop: report exits until told to stop or the kernel is gone."""

    def __init__(
        self, pipes: GuardianPipes, workers: dict[int, int], kernel_pid: int, stop_flag: Any
    ) -> None:
        self.control = pipes.control
        self.stop_flag = stop_flag
        self.status = pipes.status
        self.workers = workers  # pid -> rank, still unreported
        self.kernel_pid = kernel_pid
        self.stopping = False

    def run(self) -> None:
        wake = self._watch_signals()
        self._collect(block=False)  # a worker may have died before SIGCHLD was watched
        while not self.stopping:
            ready, _, _ = select.select([self.control, wake], [], [], _KERNEL_CHECK_SECONDS)
            _drain(wake)
            children = self._collect(block=False)
            if not self.workers and not children:
                return  # every worker ended and nothing is left below: no need to wait
            if self.control in ready:
                command = os.read(self.control, 64)
                self.stopping = self.stopping or not command or STOP in command
            if os.getppid() != self.kernel_pid:
                self.stopping = True
        self._stop(wake)

    def _watch_signals(self) -> int:
        """SIGCHLD, SIGTERM and SIGHUP wake the loop; SIGHUP stops the launch, SIGTERM marks
        it preempted (the ranks save and return)."""
        wake, wake_write = os.pipe()
        os.set_blocking(wake, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGHUP, self._request_stop)
        signal.signal(signal.SIGTERM, lambda signum, frame: self.stop_flag.preempt())
        return wake

    def _request_stop(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _stop(self, wake: int) -> None:
        """SIGTERM every worker's group, wait the grace period, then kill all that is left."""
        self.stop_flag.end()  # the workers' SIGTERM is the launch's, not the machine's
        for pid in self.workers:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + TERMINATE_GRACE_SECONDS
        while self.workers and (left := deadline - time.monotonic()) > 0:
            select.select([wake], [], [], left)
            _drain(wake)
            self._collect(block=False)
        self._sweep()

    def _sweep(self) -> None:
        """SIGKILL every descendant until none is left: orphans land here, so none escapes."""
        while self._collect(block=False):  # no child at all: nothing below, no scan needed
            for pid in descendants(os.getpid()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            self._collect(block=True)

    def _collect(self, *, block: bool) -> bool:
        """Reap exited children (all that are ready; one more if ``block``); False if none."""
        flags = os.WEXITED | os.WNOWAIT
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, flags | (0 if block else os.WNOHANG))
            except ChildProcessError:
                return False
            if info is None:
                return True
            self._bury(info)
            block = False  # after one blocking wait, take only what is ready

    def _bury(self, info: Any) -> None:
        pid = info.si_pid
        rank = self.workers.pop(pid, None)
        if rank is not None:
            # The zombie still holds its pid, so its group id cannot be reused yet.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        if rank is not None:
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            _send(self.status, rank, EXITED, code)


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass
