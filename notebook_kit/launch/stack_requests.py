"""Every rank's stacks, asked now: ``notebook_kit.stacks()`` and the loop's side of it.

The workers already answer :data:`~notebook_kit.worker.stacks.STACKS_SIGNAL` with every
thread's Python stack, from a thread that waits in ``sigwait``, so a rank blocked in C (a
``time.sleep``, a gloo collective waiting for a peer) answers as readily as a busy one. What
was missing is a way to ask from the notebook while a run is in progress: the run's loop owns
the workers' pipes and runs on the kernel's main thread (or the task that awaits the launch),
and the caller is another thread. So the caller only leaves a :class:`StackRequest` at the
run's :class:`StackDesk`; the loop takes it at its next turn (every quarter second at most),
signals the ranks, and hands each answer to the request as it is read; the caller waits on the
request until every rank answered or the deadline passed, never longer. Called on the loop's
own thread (the next cell while an awaited launch runs as a task), the caller turns the loop
itself until the answers are in.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from notebook_kit.launch.native_stacks import NativeDumps, native_note
from notebook_kit.live.ask_button import answer_asks
from notebook_kit.worker.stacks import STACKS_SIGNAL

__all__ = [
    "NO_RUN",
    "RankStacks",
    "StackDesk",
    "StackRequest",
    "ask_stacks",
    "current_desk",
    "gather",
    "stacks",
]

DEFAULT_TIMEOUT = 2.0
NO_RUN = (
    "notebook_kit.stacks() shows the ranks of a run in progress, and no launch or WorkerPool "
    "command is running in this kernel. Call it while one runs: from another thread (a "
    "threading.Thread, a second cell thread of the kernel), or from the next cell while "
    "notebook_launcher_async runs as a task (asyncio.ensure_future(notebook_launcher_async(...)))."
)


class _Worker(Protocol):
    rank: int
    pid: int
    exit_code: int | None


@dataclass
class _Asked:
    """One rank as the loop found it when the request came: asked, or why not."""

    pid: int
    why_not: str | None = None  # "not started yet", "exited with code 1": not signalled
    threads: list[dict[str, Any]] | None = None


class StackRequest:
    """One ask for every rank's stacks: filled in by the run's loop, read by the caller."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.asked = threading.Event()  # the loop has signalled the ranks
        self.answered = threading.Event()  # every signalled rank answered, or the run ended
        self.ended = ""  # why the run stopped before every rank answered
        self._lock = threading.Lock()
        self._ranks: dict[int, _Asked] = {}

    def ask(self, workers: Sequence[_Worker]) -> None:
        """On the loop's thread: signal every running rank, note why the others are not."""
        with self._lock:
            for worker in workers:
                self._ranks[worker.rank] = _ask_one(worker)
            self._check_answered()
        self.asked.set()

    def answer(self, rank: int, threads: list[dict[str, Any]]) -> None:
        """On the loop's thread: a rank's stacks have arrived."""
        with self._lock:
            asked = self._ranks.get(rank)
            if asked is not None and asked.why_not is None:
                asked.threads = threads
                self._check_answered()

    def answer_here(self, rank: int, threads: list[dict[str, Any]]) -> None:
        """The run executes in this process: ``rank``'s threads, read here, are the answer."""
        with self._lock:
            self._ranks[rank] = _Asked(os.getpid(), threads=threads)
        self.asked.set()
        self.answered.set()

    def end(self, why: str) -> None:
        """The run's loop will not turn again: nothing more will be answered."""
        with self._lock:
            self.ended = self.ended or why
        self.asked.set()
        self.answered.set()

    def pids(self) -> dict[int, int]:
        """The signalled ranks' process ids (not this process: py-spy would stop it)."""
        here = os.getpid()
        with self._lock:
            return {r: a.pid for r, a in self._ranks.items() if a.why_not is None and a.pid != here}

    def texts(self, native: dict[int, str]) -> dict[int, str]:
        """Each rank's text: its threads' stacks, or why there are none; ``native`` added."""
        with self._lock:
            ranks = dict(self._ranks)
        return {
            rank: _rank_text(rank, asked, self, native.get(rank)) for rank, asked in ranks.items()
        }

    def note(self, native_found: bool) -> str | None:
        """What the texts leave out, said once."""
        return native_note(native_found)

    def _check_answered(self) -> None:
        if all(a.why_not is not None or a.threads is not None for a in self._ranks.values()):
            self.answered.set()


class StackDesk:
    """Where a run's loop takes requests for stacks; open while the run is in progress.

    Example::

        desk = StackDesk()
        desk.open(pump)             # the run started; pump(limit) turns its loop once
        desk.take(workers)          # at every turn of the loop
        desk.on_stacks(rank, threads)
        desk.close("the run ended")
    """

    stack_request: type[StackRequest] = StackRequest  # the kind its loop knows how to ask

    def __init__(self) -> None:
        self._pending: collections.deque[StackRequest] = collections.deque()
        self._open: list[StackRequest] = []
        self._pump: Callable[[float], bool] | None = None
        self.loop_thread: int | None = None
        self.closed = False
        self.in_turn = False  # the loop is turning now (a view's callback runs inside it)

    def open(self, pump: Callable[[float], bool]) -> None:
        """From now on requests are taken; ``pump(limit)`` turns the loop once (False: over)."""
        self._pump = pump
        self.loop_thread = threading.get_ident()
        self.closed = False
        with _DESKS_LOCK:
            if self not in _DESKS:
                _DESKS.append(self)

    def close(self, why: str) -> None:
        """No more turns: every request still waiting ends with ``why``."""
        with _DESKS_LOCK, contextlib.suppress(ValueError):
            _DESKS.remove(self)
        self.closed = True  # set before the drain: a request submitted meanwhile sees one
        while self._pending:
            self._pending.popleft().end(why)
        for request in self._open:
            request.end(why)
        self._open = []
        self._pump = None

    def submit(self, timeout: float) -> StackRequest:
        """From any thread: a request the loop takes at its next turn."""
        request = self.stack_request(timeout)
        self.post(request)
        return request

    def post(self, request: StackRequest) -> None:
        """From any thread: leave ``request``, made already, for the loop's next turn."""
        self._pending.append(request)  # deque appends are atomic: no lock with the loop
        if self.closed:  # the run ended just now: nobody will take it
            request.end("the run ended")

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Around one turn of the loop: requests made inside it (a callback) cannot pump."""
        self.loop_thread, self.in_turn = threading.get_ident(), True
        try:
            yield
        finally:
            self.in_turn = False

    def take(self, workers: Any) -> None:
        """On the loop's thread: ask ``workers`` (the ranks; a cluster run: the attempt) for
        each new request; forget finished ones."""
        now = time.monotonic()
        self._open = [r for r in self._open if not r.answered.is_set() and r.deadline > now]
        while self._pending:
            request = self._pending.popleft()
            request.ask(workers)
            self._open.append(request)

    def on_stacks(self, *answer: Any) -> None:
        """On the loop's thread: an answer, for every request still open."""
        for request in self._open:
            request.answer(*answer)

    def pump_until(self, request: StackRequest) -> None:
        """Called on the loop's own thread (its turn suspended): turn it until answered."""
        if self.in_turn:
            raise RuntimeError(
                "notebook_kit.stacks() was called from inside the run's own loop (a view's "
                "callback), which cannot wait for the answers it would have to read: call "
                "ask_stacks() there and read its future on a later tick."
            )
        while not request.answered.is_set() and (left := request.deadline - time.monotonic()) > 0:
            pump = self._pump
            if pump is None or not pump(min(left, 0.05)):
                return


_DESKS: list[StackDesk] = []  # the runs in progress in this process, latest last
_DESKS_LOCK = threading.Lock()


class RankStacks(dict[int, str]):
    """``{rank: text}``, shown in a cell as every rank's text and, once, what is left out."""

    def __init__(self, texts: dict[int, str], note: str | None) -> None:
        super().__init__(sorted(texts.items()))
        self.note = note  # e.g. that native frames are missing, and how to add them

    def __str__(self) -> str:
        return "\n\n".join([*self.values(), *([self.note] if self.note else [])])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


def stacks(timeout: float = DEFAULT_TIMEOUT) -> RankStacks:
    """Every rank's stacks in the run in progress, asked now: ``{rank: text}``.

    Answered within ``timeout`` seconds whatever the ranks do: a rank blocked in C (a
    ``time.sleep``, a collective waiting for a peer) answers from a thread of its own; a rank
    that does not answer in time gets a line with its pid and state. With py-spy installed
    (``pip install 'notebook_kit[debug]'``) each rank's native frames are added.

    Example::

        threading.Thread(target=lambda: print(notebook_kit.stacks())).start()
        notebook_launcher(train, num_processes=2)

    Raises:
        RuntimeError: no launch or pool command is running in this kernel.
    """
    seconds = _checked(timeout)
    return gather(current_desk(), seconds)


def ask_stacks(timeout: float = DEFAULT_TIMEOUT) -> Any:
    """:func:`stacks` without waiting: a ``concurrent.futures.Future`` of its answer.

    For code that runs inside the run's loop (a view's button handler), which must not wait.
    """
    request = current_desk().submit(_checked(timeout))
    return in_background(lambda: _collect(request), "notebook_kit-stacks-ask")


def in_background(work: Callable[[], Any], name: str) -> Any:
    """``work()`` on a daemon thread named ``name``: a ``concurrent.futures.Future`` of its
    result or its error (what a view's button asks for, as it must not wait)."""
    import concurrent.futures

    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as error:
            future.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


answer_asks(stacks=ask_stacks)  # the view's Stacks button asks through it


def gather(desk: StackDesk, timeout: float, request: Any = None) -> RankStacks:
    """Ask ``desk``'s run for its ranks' stacks (``request``: submitted already) and wait for
    them, at most ``timeout``."""
    request = request if request is not None else desk.submit(timeout)
    if threading.get_ident() == desk.loop_thread:
        desk.pump_until(request)
    return _collect(request)


def _collect(request: StackRequest) -> RankStacks:
    """Wait for the answers (native frames read meanwhile); what came by the deadline."""
    request.asked.wait(max(0.0, request.deadline - time.monotonic()))
    dumps = NativeDumps.start(request.pids())
    request.answered.wait(max(0.0, request.deadline - time.monotonic()))
    native = dumps.collect(request.deadline) if dumps is not None else {}
    texts = request.texts(native)
    if not texts and request.ended:  # it ended before a rank was asked
        raise RuntimeError(f"{NO_RUN} (The run ended while its stacks were being asked.)")
    return RankStacks(texts, request.note(dumps is not None))


def current_desk() -> StackDesk:
    """The desk of the run in progress here (the latest started)."""
    with _DESKS_LOCK:
        if not _DESKS:
            raise RuntimeError(NO_RUN)
        return _DESKS[-1]


def _checked(timeout: Any) -> float:
    """``timeout`` as seconds above 0, or an error naming it and the default."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"stacks(timeout={timeout!r}): timeout must be a number of seconds above 0, how "
            f"long the ranks get to answer (default {DEFAULT_TIMEOUT:g})."
        )
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(
            f"stacks(timeout={timeout!r}): timeout must be above 0 seconds (and finite), how "
            f"long the ranks get to answer (default {DEFAULT_TIMEOUT:g})."
        )
    return float(timeout)


def _ask_one(worker: _Worker) -> _Asked:
    if worker.exit_code is not None:
        return _Asked(worker.pid, f"exited ({_exit_words(worker.exit_code)})")
    if not worker.pid:
        return _Asked(0, "not started yet")
    try:
        os.kill(worker.pid, STACKS_SIGNAL)
    except (ProcessLookupError, PermissionError):
        return _Asked(worker.pid, "gone before it was asked")
    return _Asked(worker.pid)


def _exit_words(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _rank_text(rank: int, asked: _Asked, request: StackRequest, native: str | None) -> str:
    head = f"rank {rank}" + (f" (pid {asked.pid})" if asked.pid else "")
    if asked.why_not is not None:
        lines = [f"{head}: {asked.why_not}"]
    elif asked.threads is None:
        why = request.ended or f"no answer within {request.timeout:g} s"
        state = process_state(asked.pid)
        lines = [f"{head}: {why}" + (f", process state {state}" if state else "")]
    else:
        lines = [head + ":"] + [_thread_text(thread) for thread in asked.threads]
    if native:
        lines += ["  native frames (py-spy dump --native):"]
        lines += ["    " + line for line in native.rstrip().splitlines()]
    return "\n".join(lines)


def _thread_text(thread: dict[str, Any]) -> str:
    where = f"waiting in {thread['collective']}" if thread["collective"] else "not in a collective"
    stack = "".join("  " + line + "\n" for line in thread["stack"].rstrip().splitlines())
    return f"  {thread['name']}, {where}\n{stack}".rstrip()


def process_state(pid: int) -> str:
    """``S (sleeping)``, ``D (disk sleep)``, ...: what the operating system says ``pid`` does."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("State:"):
                return line.split(":", 1)[1].strip()
    return ""
