"""One restart-and-conclude policy for every launch, on this machine or on a cluster's nodes.

An attempt runs every worker once and ends in an :class:`AttemptEnding`, whatever happened;
:class:`RestartPolicy` decides from it alone whether all workers start again (a rank failed
and restarts are left) or how the launch ends: the exception thrown into it (Ctrl-C, a
cancelled ``await``), ``TimeoutError``, the failure's ``WorkerError``, or rank 0's value after
its weights were brought home. A timeout or an interrupt is never retried.

Example::

    policy = RestartPolicy(max_restarts=1, timeout=None, run="launch", everyone="all workers")
    value = yield from policy.run_attempts(one_attempt)  # one_attempt(restart_count)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator
from typing import Any

from notebook_kit.errors import WorkerError
from notebook_kit.launch.batch_sizes import BatchSizeAgreement

__all__ = ["AttemptEnding", "RestartPolicy"]


@dataclasses.dataclass
class AttemptEnding:
    """How one attempt ended, once every worker it started has stopped.

    Attributes:
        error: What was thrown into the attempt (Ctrl-C, a cancelled ``await``): raised again.
        timed_out: The launch's ``timeout`` passed and every worker was stopped.
        failure: A rank failed or a node was lost.
        value: Rank 0's return value, when nothing failed.
        bring_home: Loads rank 0's trained weights into the kernel's models; only called for
            the attempt whose value is returned, so a failed run leaves those models untouched.
    """

    error: BaseException | None = None
    timed_out: bool = False
    failure: WorkerError | None = None
    value: Any = None
    bring_home: Callable[[], None] | None = None


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """``max_restarts`` restarts of every worker after a failure, then the launch's ending.

    Attributes:
        max_restarts: Times all workers start again after a failed attempt.
        timeout: The launch's ``timeout``, named in its ``TimeoutError``.
        run: What the messages call the launch ("launch", "cluster run").
        everyone: What a restart starts and a timeout stops ("all 2 workers", "all 2 nodes").
    """

    max_restarts: int
    timeout: float | None
    run: str
    everyone: str
    agrees_batch_size: bool = False

    def run_attempts(
        self, attempt: Callable[[int], Generator[Any, Any, AttemptEnding]]
    ) -> Generator[Any, Any, Any]:
        """Drive ``attempt(restart_count)`` until one ends for good; its value, or raise.

        With ``agrees_batch_size`` (a launch whose every rank this policy starts), a rank out
        of memory in ``find_executable_batch_size`` restarts every worker at a smaller size
        without charging ``max_restarts``: each such restart is smaller, so they end.
        """
        restart = 0  # restarts of every worker so far: each attempt's restart_count
        charged = 0  # those max_restarts counts: after a failure
        agreement = BatchSizeAgreement() if self.agrees_batch_size else None
        while True:
            steps = attempt(restart)
            if agreement is not None:
                steps = agreement.forked_with_sizes(steps)
            ending = yield from steps
            if agreement is None or not agreement.agrees_after(_failure_of(ending)):
                if not self.restarts_after(ending, charged):
                    return self.conclude(ending)
                charged += 1
            restart += 1

    def restarts_after(self, ending: AttemptEnding, restart: int) -> bool:
        """Whether all workers start again after this ending; says so in the cell when they do."""
        if ending.error is not None or ending.timed_out or ending.failure is None:
            return False
        if restart >= self.max_restarts:
            return False
        print(
            f"{ending.failure.restart_reason()}; restarting {self.everyone} "
            f"(restart {restart + 1} of {self.max_restarts}).",
            flush=True,
        )
        return True

    def conclude(self, ending: AttemptEnding) -> Any:
        """The launch's value, or the exception that ends it."""
        if ending.error is not None:
            raise ending.error
        if ending.timed_out:
            raise TimeoutError(
                f"The {self.run} did not finish within timeout={self.timeout} s; "
                f"{self.everyone} were stopped. Raise timeout or pass None."
            )
        if ending.failure is not None:
            raise ending.failure
        if ending.bring_home is not None:
            ending.bring_home()
        return ending.value


def _failure_of(ending: AttemptEnding) -> WorkerError | None:
    """The failure that ended the attempt; None when Ctrl-C or the timeout did (never retried)."""
    return None if ending.error is not None or ending.timed_out else ending.failure
