"""The kernel's side of a launch: watch the workers, relay their output, stop them.

One loop waits on every worker's pipes and exit at once (``multiprocessing.connection.wait``),
so a large result is read while it is being written, output appears as it is printed, and a
dead rank is noticed within one wake-up. Nothing here sleeps on a fixed schedule.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from notebook_kit.errors import WorkerFailure, describe_exit
from notebook_kit.live.observer import LaunchObserver, RankSummary, Stream

# After the first failure, collect the others' reports this long before picking a culprit.
_FAILURE_SETTLE_SECONDS = 0.1
_SECONDARY_SETTLE_SECONDS = 1.0
_STOP_EXIT_CODES = (-int(signal.SIGTERM), -int(signal.SIGKILL))
# How long a worker gets between SIGTERM and SIGKILL.
_TERMINATE_GRACE_SECONDS = 0.5
# Longest sleep of the loop: bounds how late a timeout or an observer tick can be.
_TICK_SECONDS = 0.25


@dataclass
class LineReader:
    """Reassembles whole lines from one worker's output pipe."""

    fd: int
    rank: int
    stream: Stream
    pending: bytes = b""
    closed: bool = False

    def read(self, emit: Callable[[int, Stream, str], None]) -> None:
        """Read what is available without blocking and emit every complete line."""
        while not self.closed:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                self.close(emit)
                return
            *lines, self.pending = (self.pending + chunk).split(b"\n")
            for line in lines:
                emit(self.rank, self.stream, line.decode("utf-8", "backslashreplace"))

    def close(self, emit: Callable[[int, Stream, str], None]) -> None:
        if self.closed:
            return
        if self.pending:
            emit(self.rank, self.stream, self.pending.decode("utf-8", "backslashreplace"))
            self.pending = b""
        self.closed = True
        os.close(self.fd)


@dataclass
class WorkerProcess:
    """The kernel's handle on one forked worker."""

    rank: int
    pid: int
    stdout: LineReader
    stderr: LineReader
    messages: Connection
    started: float = field(default_factory=time.monotonic)
    pidfd: int | None = None
    exit_code: int | None = None
    ended: float | None = None
    reported: bool = False  # sent its result (rank 0) or "done"
    error: dict[str, Any] | None = None

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    def waitables(self) -> list[Any]:
        objects: list[Any] = [r.fd for r in (self.stdout, self.stderr) if not r.closed]
        if not self.messages.closed:
            objects.append(self.messages)
        if self.alive and self.pidfd is not None:
            objects.append(self.pidfd)
        return objects


@dataclass
class LaunchOutcome:
    """How a launch ended: rank 0's payload, or the failures."""

    result: dict[str, Any] | None
    failures: list[WorkerFailure]
    timed_out: bool = False


class Supervisor:
    """Runs the wait loop over forked workers and stops them when it must."""

    def __init__(self, workers: list[WorkerProcess], observer: LaunchObserver) -> None:
        self.workers = workers
        self.observer = observer
        self.result: dict[str, Any] | None = None
        self.failures: list[WorkerFailure] = []
        self.timed_out = False
        self._deadline: float | None = None
        self._stopping = False  # exits from here on are ours, not failures

    def start_clock(self, timeout: float | None) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def wait_limit(self) -> float | None:
        """How long the next wait may block; None once the launch is over."""
        if not any(worker.alive for worker in self.workers):
            return None
        now = time.monotonic()
        if self.failures and now - self.failures[0].time > self._settle_seconds():
            return None
        if self._deadline is not None and now >= self._deadline:
            self.timed_out = True
            return None
        limit = _TICK_SECONDS
        if self._deadline is not None:
            limit = min(limit, self._deadline - now)
        if self.failures:
            limit = min(limit, _FAILURE_SETTLE_SECONDS / 4)
        return max(limit, 0.0)

    def _settle_seconds(self) -> float:
        """How long to collect reports after the first failure before stopping everyone.

        An error that only says a peer went away implies a rank died: wait longer for that
        death to be seen (a big process can take a while to exit under load).
        """
        if all(failure.is_secondary for failure in self.failures):
            return _SECONDARY_SETTLE_SECONDS
        return _FAILURE_SETTLE_SECONDS

    def waitables(self) -> list[Any]:
        """Every descriptor and connection the loop waits on."""
        return [obj for worker in self.workers for obj in worker.waitables()]

    def serve(self, ready: list[Any]) -> None:
        """Handle what a wait returned, then let the observer refresh."""
        self._serve(ready)
        self.observer.on_tick()

    def rank_summaries(self) -> tuple[RankSummary, ...]:
        return tuple(
            RankSummary(w.rank, w.exit_code, (w.ended or time.monotonic()) - w.started)
            for w in self.workers
        )

    def outcome(self) -> LaunchOutcome:
        """What the launch came to; called after ``shutdown``, which drained every pipe."""
        if self.timed_out:
            return LaunchOutcome(None, [], timed_out=True)
        return LaunchOutcome(self.result, self.failures)

    def shutdown(self) -> None:
        """Stop every worker still alive (SIGTERM, then SIGKILL), reap all, close pipes."""
        self._stopping = True
        _signal_alive(self.workers, signal.SIGTERM)
        deadline = time.monotonic() + _TERMINATE_GRACE_SECONDS
        while any(w.alive for w in self.workers) and time.monotonic() < deadline:
            for worker in self.workers:
                self._poll_exit(worker)
            time.sleep(0.005)
        _signal_alive(self.workers, signal.SIGKILL)
        for worker in self.workers:
            if worker.alive:
                self._reap(worker, block=True)
        self._drain_all()
        for worker in self.workers:
            worker.messages.close()
            for reader in (worker.stdout, worker.stderr):
                reader.close(self.observer.on_output)
            if worker.pidfd is not None:
                os.close(worker.pidfd)
                worker.pidfd = None

    # -- the loop's steps ----------------------------------------------------------------

    def _serve(self, ready: list[Any]) -> None:
        ready_ids = {id(obj) for obj in ready} | {obj for obj in ready if isinstance(obj, int)}
        for worker in self.workers:
            for reader in (worker.stdout, worker.stderr):
                if not reader.closed and reader.fd in ready_ids:
                    reader.read(self.observer.on_output)
            if not worker.messages.closed and id(worker.messages) in ready_ids:
                self._receive(worker)
            if worker.alive and (worker.pidfd is None or worker.pidfd in ready_ids):
                self._poll_exit(worker)

    def _receive(self, worker: WorkerProcess) -> None:
        """Read every message waiting on a worker's connection."""
        with contextlib.suppress(EOFError, OSError):
            while not worker.messages.closed and worker.messages.poll():
                kind, payload = pickle.loads(worker.messages.recv_bytes())
                self._handle_message(worker, kind, payload)
            return
        worker.messages.close()  # the worker is gone; its exit status tells the rest

    def _handle_message(self, worker: WorkerProcess, kind: str, payload: Any) -> None:
        if kind == "result":
            worker.reported = True
            self.result = payload
        elif kind == "done":
            worker.reported = True
        elif kind == "error":
            worker.error = payload
            self.failures.append(
                WorkerFailure(
                    rank=worker.rank,
                    exit_code=None,
                    exception_type=payload["type"],
                    message=payload["message"],
                    traceback=payload["traceback"],
                    time=payload["time"],
                )
            )
        else:
            self.observer.on_message(worker.rank, kind, payload)

    def _poll_exit(self, worker: WorkerProcess) -> None:
        if worker.alive:
            self._reap(worker, block=False)

    def _reap(self, worker: WorkerProcess, *, block: bool) -> None:
        """Collect a worker's exit status; sweep its process group first (no orphans)."""
        flags = os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG)
        try:
            status = os.waitid(os.P_PID, worker.pid, flags)
        except ChildProcessError:
            status = None
        if status is None and not block:
            return
        # The zombie still holds its pid, so its group id cannot be reused yet.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(worker.pid, 0)
        worker.ended = time.monotonic()
        worker.exit_code = _exit_code(status)
        self._drain(worker)
        unexplained = worker.error is None and not (worker.exit_code == 0 and worker.reported)
        stopped_by_us = self._stopping and worker.exit_code in _STOP_EXIT_CODES
        if unexplained and not stopped_by_us:
            self.failures.append(_failure_from_exit(worker))

    def _drain(self, worker: WorkerProcess) -> None:
        """Read what a worker left in its pipes (it wrote all of it before exiting)."""
        if not worker.messages.closed:
            self._receive(worker)
        for reader in (worker.stdout, worker.stderr):
            reader.read(self.observer.on_output)

    def _drain_all(self) -> None:
        for worker in self.workers:
            self._drain(worker)


def _exit_code(status: Any) -> int:
    if status is None:
        return -int(signal.SIGKILL)
    if status.si_code == os.CLD_EXITED:
        return status.si_status
    return -status.si_status


def _failure_from_exit(worker: WorkerProcess) -> WorkerFailure:
    code = worker.exit_code if worker.exit_code is not None else -int(signal.SIGKILL)
    if code == 0:
        message = "exited with code 0 before its function returned (os._exit(0)?)"
    else:
        message = describe_exit(code)
    return WorkerFailure(
        rank=worker.rank,
        exit_code=code,
        exception_type=None,
        message=message,
        traceback="",
        time=worker.ended or time.monotonic(),
    )


def _signal_alive(workers: list[WorkerProcess], signum: int) -> None:
    for worker in workers:
        if worker.alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.pid, signum)
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signum)  # in case it has not left the kernel's group yet


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back Ctrl-C while the workers are being cleaned up, then deliver it once.

    The kernel's SIGINT handler is put back as it was before the block ends.
    """
    try:
        previous = signal.getsignal(signal.SIGINT)
        received: list[int] = []
        signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    except ValueError:  # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt
