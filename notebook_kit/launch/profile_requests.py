"""Profile the next steps of the run in progress on every rank: ``notebook_kit.profile()``.

Beside the stacks requests (:mod:`~notebook_kit.launch.stack_requests`), through the same
desk: the caller leaves a :class:`ProfileRequest` there; at its next turn the run's loop leaves
each rank its order (:func:`~notebook_kit.worker.step_profiler.write_order`) and sends it
:data:`~notebook_kit.worker.step_profiler.PROFILE_SIGNAL`; each rank's answer, a
:class:`~notebook_kit.runtime.messages.ProfileDone`, is handed to the request as the loop reads
it. A forked launch's and a pool's supervisor keep a :class:`RunDesk`, the stacks desk that
also takes these; a cluster run's desk asks its nodes, whose node processes ask their ranks so
(:mod:`notebook_kit.launch.cluster.cluster_stacks`); a run in this process is refused.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from notebook_kit.launch.stack_requests import StackDesk, StackRequest, current_desk, in_background
from notebook_kit.live.ask_button import answer_asks
from notebook_kit.live.profile_panel import profile_taken
from notebook_kit.runtime.messages import ProfileDone, ProfileOrder
from notebook_kit.worker.step_profiler import PROFILE_SIGNAL, write_order

__all__ = [
    "ProfileRequest",
    "ProfileResult",
    "RankProfiles",
    "RunDesk",
    "ask_profile",
    "post_profile",
    "profile",
]

DEFAULT_TIMEOUT = 120.0
_numbers = itertools.count(1)
NO_RUN = (
    "notebook_kit.profile() profiles the next steps of a run in progress, and no launch or "
    "WorkerPool command is running in this kernel. Call it while one runs: from another "
    "thread, or from the next cell while notebook_launcher_async runs as a task."
)
NOT_FORKED = (
    "notebook_kit.profile() profiles the forked ranks of a launch or a WorkerPool command; "
    "this run is in this process. Profile it from inside the function with "
    "accelerator.profile() instead."
)


@dataclass(frozen=True)
class ProfileResult:
    """One rank's profile of the steps asked for.

    Attributes:
        rank: The rank.
        trace: Its Chrome trace (open it in Perfetto or chrome://tracing).
        steps: Steps profiled.
        table: ``(operator, calls, self CPU ms, total CPU ms)``, the most self time first.
        step_spans: Each step's ``(start, end)`` in ms from the first step's start.
        spans: The operators run directly in a step, ``(name, start, end)`` in ms.
    """

    rank: int
    trace: Path
    steps: int
    table: tuple[tuple[str, int, float, float], ...]
    step_spans: tuple[tuple[float, float], ...] = ()
    spans: tuple[tuple[str, float, float], ...] = ()

    def text(self) -> str:
        """Its top operators as a plain-text table, headed by the rank and the trace."""
        head = f"rank {self.rank} · {self.steps} steps · trace {self.trace}"
        rows = [f"  {'operator':<40} {'calls':>7} {'self CPU ms':>12} {'total ms':>10}"]
        rows += [f"  {n[:40]:<40} {c:>7} {s:>12.3f} {t:>10.3f}" for n, c, s, t in self.table]
        return "\n".join([head, *rows])


class RankProfiles(dict[int, ProfileResult]):
    """``{rank: ProfileResult}``, shown in a cell as every rank's table."""

    def __str__(self) -> str:
        return "\n\n".join(result.text() for result in self.values())

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


class ProfileRequest(StackRequest):
    """One ask for a profile of the next ``steps`` steps on every rank (at the stacks' desk)."""

    def __init__(self, steps: int, timeout: float, folder: Path | None = None) -> None:
        super().__init__(timeout)
        self.number, self.steps = next(_numbers), steps
        stamp = f"notebook_kit-profile-{time.strftime('%Y%m%d-%H%M%S')}-{self.number}"
        self.folder = folder if folder is not None else Path(tempfile.gettempdir()) / stamp
        self.why_not: dict[int, str] = {}  # ranks not asked, and why
        self.errors: dict[int, str] = {}  # ranks that could not profile, and why
        self.results: dict[int, ProfileResult] = {}
        self._pids: dict[int, int] = {}

    def ask(self, workers: Sequence[Any]) -> None:
        """On the loop's thread: leave every running rank its order and signal it."""
        order = ProfileOrder(self.number, self.steps, str(self.folder), self.timeout)
        for worker in workers:
            if worker.exit_code is not None or not worker.pid:
                self.why_not[worker.rank] = "exited" if worker.pid else "not started yet"
            elif _signal(worker.pid, order):
                self._pids[worker.rank] = worker.pid
            else:
                self.why_not[worker.rank] = "gone before it was asked"
        self.asked.set()
        self._check()

    def answer(self, *_: Any) -> None:
        """A rank's stacks: not for this request."""

    def profiled(self, rank: int, done: ProfileDone) -> None:
        """On the loop's thread: ``rank``'s answer has arrived."""
        if done.number != self.number or rank not in self._pids:
            return
        with self._lock:
            if done.error:
                self.errors[rank] = done.error
            else:
                self.results[rank] = ProfileResult(
                    rank, Path(done.trace), done.steps, done.table, done.step_spans, done.spans
                )
        self._check()

    def missing(self) -> list[int]:
        """The asked ranks that have not answered."""
        with self._lock:
            return sorted(set(self._pids) - set(self.results) - set(self.errors))

    def cancel(self) -> None:
        """The caller stops waiting: the ranks still profiling stop at their next step."""
        cancel = ProfileOrder(self.number, 0, str(self.folder), self.timeout)
        for rank in self.missing():
            _signal(self._pids[rank], cancel)

    def _check(self) -> None:
        if self.asked.is_set() and not self.missing():
            self.answered.set()


class RunDesk(StackDesk):
    """A forked run's desk: the stacks requests, and these."""

    profile_request = ProfileRequest  # the kind its loop knows how to ask

    def on_profile(self, rank: int, done: ProfileDone) -> None:
        """On the loop's thread: a rank's answer, for every request still open."""
        for request in self._open:
            if isinstance(request, ProfileRequest):
                request.profiled(rank, done)


def profile(
    steps: int = 5, timeout: float = DEFAULT_TIMEOUT, folder: str | os.PathLike[str] | None = None
) -> RankProfiles:
    """Profile the next ``steps`` steps of the run in progress on every rank: ``{rank: result}``.

    Each rank starts ``torch.profiler`` at its next step boundary (a prepared loader's batch,
    a ``log(samples=...)`` call, or else an ``accelerator.backward``), stops after ``steps``
    steps and writes its Chrome trace ``profile_<rank>.json`` in ``folder`` (a new folder of
    the temporary directory by default).

    Example::

        threading.Thread(target=lambda: print(notebook_kit.profile(steps=3))).start()
        notebook_launcher(train, num_processes=2)

    Raises:
        TypeError, ValueError: ``steps`` is not a whole number above 0, or ``timeout`` is not
            a number of seconds above 0.
        RuntimeError: no forked launch or pool command is running in this kernel.
        TimeoutError: a rank did not profile its steps within ``timeout`` (named).
    """
    request, desk = _request(steps, timeout, folder)
    if threading.get_ident() == desk.loop_thread:
        desk.pump_until(request)  # type: ignore[arg-type]
    return _collect(request)


def ask_profile(
    steps: int = 5, timeout: float = DEFAULT_TIMEOUT, folder: str | os.PathLike[str] | None = None
) -> concurrent.futures.Future[RankProfiles]:
    """:func:`profile` without waiting: a future of its answer (for a view's button)."""
    request, _ = _request(steps, timeout, folder)
    return in_background(lambda: _collect(request), "notebook_kit-profile-ask")


answer_asks(profile=ask_profile)  # the view's Profile button asks through it


def _request(
    steps: Any, timeout: Any, folder: str | os.PathLike[str] | None
) -> tuple[ProfileRequest, RunDesk]:
    """Check the arguments and find the run, then leave the request at its desk."""
    _check_steps(steps)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"profile(timeout={timeout!r}): timeout must be seconds above 0.")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"profile(timeout={timeout!r}): timeout must be seconds above 0.")
    try:
        desk = current_desk()
    except RuntimeError:
        raise RuntimeError(NO_RUN) from None
    if not isinstance(desk, RunDesk):
        raise RuntimeError(NOT_FORKED)
    request = desk.profile_request(steps, float(timeout), None if folder is None else Path(folder))
    desk.post(request)
    return request, desk


def post_profile(steps: int, timeout: float, folder: str) -> ProfileRequest:
    """Leave the run in progress here a request, without waiting (a cluster node's answer to
    its kernel's ``profile()``); :class:`RuntimeError` when there is no such run."""
    return _request(steps, timeout, folder)[0]


def _check_steps(steps: Any) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(
            f"profile(steps={steps!r}): steps must be a whole number of training steps above "
            f"0, how many of the next steps to profile (e.g. steps=5)."
        )
    if steps <= 0:
        raise ValueError(
            f"profile(steps={steps!r}): steps must be above 0, how many of the next steps to "
            f"profile (e.g. steps=5)."
        )


def _collect(request: ProfileRequest) -> RankProfiles:
    """Wait for every rank, at most until the deadline; the answers, or which ranks failed."""
    request.answered.wait(max(0.0, request.deadline - time.monotonic()))
    missing = request.missing()
    results = RankProfiles(sorted(request.results.items()))
    if results:
        profile_taken(results)  # the run's view shows them and last_run().profile keeps them
    if request.errors or request.why_not:  # every rank or none: a partial profile misleads
        request.cancel()
        said = "; ".join(
            f"rank {rank}: {why}"
            for rank, why in sorted({**request.why_not, **request.errors}.items())
        )
        raise RuntimeError(f"notebook_kit.profile(steps={request.steps}): {said}")
    if missing or (not results and request.ended):
        request.cancel()
        why = request.ended or f"within {request.timeout:g} s"
        error = TimeoutError(
            f"notebook_kit.profile(steps={request.steps}): rank(s) "
            f"{', '.join(map(str, missing)) or 'all'} did not profile {request.steps} steps "
            f"({why}). A step is a prepared loader's batch, a log(samples=...) call or else an "
            f"accelerator.backward(); ask for "
            f"fewer steps or a longer timeout."
        )
        error.results = results  # type: ignore[attr-defined]  # what the others profiled
        raise error
    return results


def _signal(pid: int, order: ProfileOrder) -> bool:
    try:
        write_order(pid, order)
        os.kill(pid, PROFILE_SIGNAL)
    except (ProcessLookupError, PermissionError):
        return False
    return True
