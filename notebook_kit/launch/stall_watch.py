"""A run in which no rank makes progress: say so in the cell, and where each rank waits.

The classic distributed hang — one rank in ``should_stop()``'s vote or a collective that
another rank never enters, or a rank that went on alone — is silent: every rank waits until a
timeout (gloo's default is 30 minutes). The supervisor's loop notes the time of every line
and message that arrives (that is all it costs while a run makes progress); after
``stall_seconds`` without any, it asks each worker for its live Python stacks
(:mod:`notebook_kit.worker.stacks`, which answers without stopping it) and prints, once per
stall, which collective each rank is in and where in its code. The run goes on.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Collection, Sequence
from typing import Any, Protocol

from notebook_kit.runtime.waiting import STOP_VOTE
from notebook_kit.worker.stacks import STACKS_SIGNAL

__all__ = ["StallWatch", "describe_stall", "naming_ranks_in_pdb"]

_ANSWER_SECONDS = 2.0  # how long the workers get to send their stacks


class _Worker(Protocol):
    rank: int
    pid: int

    @property
    def alive(self) -> bool: ...


class StallWatch:
    """Notices when no rank has made progress for ``seconds`` and shows where they wait.

    Example::

        watch = StallWatch()
        watch.start(60.0)
        watch.progress()            # at every line or message from a rank
        watch.check(workers)        # at every turn of the wait loop
    """

    def __init__(self) -> None:
        self.seconds: float | None = None
        self._last: float | None = None  # the latest progress; None while not watching
        self._asked_at: float | None = None
        self._asked: set[int] = set()
        self._answers: dict[int, list[dict[str, Any]]] = {}
        self._reported = False
        self.in_debugger: set[int] = set()  # ranks at a pdb prompt: waiting for you, not stuck

    def start(self, seconds: float | None) -> None:
        """Watch from now on (``seconds=None``: never report)."""
        self.seconds = seconds
        self._last = time.monotonic() if seconds is not None else None
        self._asked_at, self._reported = None, False

    def stop(self) -> None:
        self._last = None
        self._asked_at = None

    def progress(self) -> None:
        """A rank printed or sent something: the run is moving (a later stall is new)."""
        if self._last is not None:
            self._last = time.monotonic()
            self._reported = False

    def on_stacks(self, rank: int, threads: list[dict[str, Any]]) -> None:
        self._answers[rank] = threads

    def check(self, workers: Sequence[_Worker]) -> None:
        """Ask for stacks once the run has stalled; print them once they are in."""
        if self._last is None or self.seconds is None or self._reported:
            return
        now = time.monotonic()
        if self._asked_at is None:
            if now - self._last >= self.seconds:
                self._ask(workers, now)
            return
        if self._asked <= set(self._answers) or now - self._asked_at >= _ANSWER_SECONDS:
            stalled_for = self._asked_at - self._last
            report = describe_stall(stalled_for, self._asked, self._answers, self.in_debugger)
            print(report, flush=True)
            self._asked_at, self._reported = None, True

    def _ask(self, workers: Sequence[_Worker], now: float) -> None:
        self._asked_at, self._answers, self._asked = now, {}, set()
        for worker in workers:
            if worker.alive and worker.pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(worker.pid, STACKS_SIGNAL)
                    self._asked.add(worker.rank)


_HEADING = "No rank has made progress"


def naming_ranks_in_pdb(report: str, in_debugger: Collection[int]) -> str:
    """A node's stall report as the kernel of a cluster run shows it: the ranks of other
    nodes at a pdb prompt, which that node cannot see, named as the ones its ranks wait for.

    Example:
        >>> print(naming_ranks_in_pdb("No rank has made progress for 9 s ...:", {1}))
        No rank has made progress for 9 s ...:
          rank 1 is in the debugger (pdb) on another node, waiting for a command
    """
    named = [
        rank for rank in sorted(in_debugger) if f"rank {rank} is in the debugger" not in report
    ]
    if not report.startswith(_HEADING) or not named:
        return report
    first, _, rest = report.partition("\n")
    lines = [
        f"  rank {rank} is in the debugger (pdb) on another node, waiting for a command"
        for rank in named
    ]
    return "\n".join([first, *lines, *([rest] if rest else [])])


def describe_stall(
    seconds: float,
    ranks: set[int],
    answers: dict[int, list[dict[str, Any]]],
    in_debugger: Collection[int] = (),
) -> str:
    """The report: how long nothing moved, then each rank's collective and stack.

    Example:
        >>> print(describe_stall(60, {0}, {0: [{"collective": "dist.barrier", "stack": ""}]}))
        No rank has made progress for 60 s (no step, log or output). ...
          rank 0: waiting in dist.barrier
        Interrupt the kernel to stop the run; ...
    """
    lines = [
        f"{_HEADING} for {seconds:.0f} s (no step, log or output). The run "
        "goes on; this is where each rank is:"
    ]
    collectives: dict[int, str | None] = {}
    for rank in sorted(ranks):
        if rank in in_debugger:
            lines.append(f"  rank {rank} is in the debugger (pdb), waiting for a command")
            continue
        threads = answers.get(rank)
        if threads is None:
            lines.append(f"  rank {rank}: no answer (busy in native code that holds the GIL?)")
            continue
        busy = next((t for t in threads if t["collective"]), threads[0] if threads else None)
        collective = busy["collective"] if busy else None
        collectives[rank] = collective
        where = f"waiting in {collective}" if collective else "not in a collective"
        lines.append(f"  rank {rank}: {where}")
        if busy and busy["stack"]:
            lines += ["    " + line for line in busy["stack"].rstrip().splitlines()]
    lines += _advice(collectives)
    lines.append(
        "Interrupt the kernel to stop the run; stall_seconds= sets when this report shows "
        "(None: never)."
    )
    return "\n".join(lines)


def _advice(collectives: dict[int, str | None]) -> list[str]:
    """What the collectives say about the hang, when they say something."""
    waiting = {rank: c for rank, c in collectives.items() if c}
    idle = sorted(rank for rank, c in collectives.items() if not c)
    advice = []
    if len(set(waiting.values())) > 1:
        advice.append(
            "The ranks wait in different collectives, so they will never meet: every rank "
            "must make the same collective calls in the same order."
        )
    if STOP_VOTE in waiting.values():
        advice.append(
            "should_stop() is itself a collective: call it on every rank, at the same steps."
        )
    if waiting and idle:
        noun = "rank" if len(idle) == 1 else "ranks"
        advice.append(
            f"{noun.capitalize()} {', '.join(map(str, idle))} never joined: the others wait "
            f"for {'it' if len(idle) == 1 else 'them'}."
        )
    return advice
