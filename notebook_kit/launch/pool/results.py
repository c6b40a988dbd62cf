"""Turning a pool command's answers into the kernel's result or exception."""

from __future__ import annotations

import pickle
import time
from typing import Any

from notebook_kit.errors import PoolFate, WorkerFailure
from notebook_kit.launch.pool.backend import PoolBackend, RunOutcome, WorkersStopped
from notebook_kit.live.observer import LaunchSummary, RankSummary
from notebook_kit.runtime.messages import PoolAnswer

__all__ = ["STILL_RUNNING", "ShownText", "decode_value", "failures_of", "raise_for", "run_summary"]

STILL_RUNNING = (
    "The pool's workers are still running, with everything defined on them: fix the cause "
    "and run again."
)


def failures_of(answers: dict[int, PoolAnswer]) -> list[WorkerFailure]:
    """The ranks whose answer is an error, as failures."""
    return [
        answer.failure.on_rank(rank)
        for rank, answer in sorted(answers.items())
        if answer.status == "error" and answer.failure is not None
    ]


class ShownText:
    """Shows a text as a value's representation (a value the kernel could not rebuild)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def decode_value(payload: dict[str, Any] | None, rank: int, *, for_display: bool) -> Any:
    """Rebuild a rank's value in the kernel.

    Args:
        payload: The value the rank answered (``PoolAnswer.value``; None: none was asked).
        rank: Its rank, for the error message.
        for_display: A cell's result: when it cannot be rebuilt here, show its text instead.
    """
    if payload is None:
        return None
    if "repr" in payload:
        if for_display:
            return ShownText(payload["repr"])
        raise TypeError(
            f"Rank {rank}'s value cannot be pickled back to the kernel "
            f"({payload['unpicklable']}); it is {payload['repr'][:200]}. Return plain data, "
            f"tensors or a state_dict, or keep it on the workers and use it by name."
        )
    data = payload.get("value")
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception as error:
        raise TypeError(
            f"Rank {rank}'s value could not be rebuilt in the kernel ({type(error).__name__}: "
            f"{error}): it needs something only the workers have. Return plain data, or "
            f"import or define what it needs in the kernel too."
        ) from error


def run_summary(
    outcome: RunOutcome,
    error: BaseException | None,
    exit_codes: dict[int, int | None],
    started: float,
    stopped: bool,
) -> LaunchSummary:
    """How one pool run ended, for its view and ``last_run()``.

    A rank's "exit code" is 0 when it answered, 1 when it raised, its real exit code when it
    died, None when it was still running.
    """
    duration = time.monotonic() - started
    ranks = tuple(
        RankSummary(rank, _exit_code(outcome.answers.get(rank), code), duration)
        for rank, code in sorted(exit_codes.items())
    )
    return LaunchSummary(
        ranks=ranks,
        duration=duration,
        failures=tuple(failures_of(outcome.answers)),
        timed_out=outcome.timed_out,
        interrupted=outcome.interrupted or isinstance(error, KeyboardInterrupt),
        stopped=stopped,
        error=error,
        workers_kept=error is None,  # any exception out of a command stopped the workers
    )


KEPT = "the workers keep everything defined on them."


def raise_for(
    outcome: RunOutcome, error: BaseException | None, timeout: float | None, backend: PoolBackend
) -> None:
    """Raise what the command came to, saying each time what became of the workers.

    ``error`` is what ended the command in the kernel: :class:`WorkersStopped`, or another
    exception (Ctrl-C while a command was being sent) after which the workers were stopped.
    """
    if isinstance(error, WorkersStopped):
        _raise_stopped(outcome, error, timeout, backend)
    if isinstance(error, KeyboardInterrupt):
        print(
            "Interrupted while the command was being sent or answered, so the workers were "
            f"stopped. {backend.stopped_words}",
            flush=True,
        )
    if error is not None:
        raise error
    if outcome.interrupted:
        print(f"Interrupted on every rank; {KEPT}", flush=True)
        raise KeyboardInterrupt
    failures = failures_of(outcome.answers)
    if failures:
        raise backend.error(failures, STILL_RUNNING, "running")
    if outcome.timed_out:
        raise TimeoutError(
            f"The run did not finish within timeout={timeout} s and was interrupted on every "
            f"rank; {KEPT}"
        )


def _raise_stopped(
    outcome: RunOutcome, error: WorkersStopped, timeout: float | None, backend: PoolBackend
) -> None:
    words = backend.stopped_words
    if outcome.interrupted:
        print(f"Interrupted; the workers were stopped: {error.reason}. {words}", flush=True)
        raise KeyboardInterrupt
    if outcome.timed_out:
        raise TimeoutError(
            f"The run did not finish within timeout={timeout} s. It was interrupted on every "
            f"rank, but {error.reason}, so the workers were stopped. {words}"
        ) from None
    failures = failures_of(outcome.answers) + error.failures
    if not failures:
        raise RuntimeError(f"The pool's workers were stopped: {error.reason}. {words}")
    fate: PoolFate = "stopped" if backend.restarts_after_fault else "closed"
    aftermath = f"The workers were stopped: {error.reason}. {words}"
    raise backend.error(failures, aftermath, fate) from None


def _exit_code(answer: PoolAnswer | None, exit_code: int | None) -> int | None:
    if exit_code is not None:
        return exit_code
    if answer is None:
        return None
    return 0 if answer.status == "ok" else 1
