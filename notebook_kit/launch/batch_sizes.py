"""The kernel's half of ``find_executable_batch_size`` in a launch: every rank restarts smaller.

When a rank runs out of memory, the others may already wait for it in a collective (DDP's
all-reduce), and no message between ranks can reach them there. The rank ends instead with
a :class:`~notebook_kit.runtime.batch_agreement.BatchSizeReduction`; the launch's restart
policy asks :meth:`BatchSizeAgreement.agrees_after` whether the failure was one, and if so
stops every rank and starts them all again, each reading the agreed sizes from the variable
that :meth:`BatchSizeAgreement.forked_with_sizes` sets while they are forked.

Example::

    agreement = BatchSizeAgreement()
    ending = yield from agreement.forked_with_sizes(attempt(restart))
    if agreement.agrees_after(ending.failure):  # printed: "rank 1 ran out of memory ..."
        ...  # start every worker again; max_restarts is not charged
"""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import Any, TypeVar

from notebook_kit.errors import WorkerError
from notebook_kit.runtime.batch_agreement import AGREED_SIZES_VARIABLE, reduction_of
from notebook_kit.runtime.context import temporary_environment

__all__ = ["BatchSizeAgreement"]

Ending = TypeVar("Ending")


class BatchSizeAgreement:
    """The batch sizes a launch's ranks agreed on, by decorated function, across attempts."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}

    def agrees_after(self, failure: WorkerError | None) -> bool:
        """Whether this failure was a rank out of memory that every rank restarts from.

        Only the root cause counts (the others' errors follow from it), and only a size below
        the one agreed before: each restart is smaller, so the restarts end.
        """
        if failure is None:
            return False
        reduction = reduction_of(failure.failure)
        if reduction is None:
            return False
        before = self.sizes.get(reduction.key, reduction.size)
        if not 0 < reduction.next_size < min(before, reduction.size):
            return False
        self.sizes[reduction.key] = reduction.next_size
        print(reduction.say(), flush=True)
        return True

    def forked_with_sizes(self, steps: Generator[Any, Any, Ending]) -> Generator[Any, Any, Ending]:
        """``yield from steps``, whose first step (where the workers are forked) runs with the
        agreed sizes in the environment, put back before anything else runs in the kernel."""
        with temporary_environment({AGREED_SIZES_VARIABLE: json.dumps(self.sizes)}):
            try:
                request = next(steps)
            except StopIteration as done:
                return done.value
        while True:
            try:
                try:
                    reply = yield request
                except BaseException as thrown:  # Ctrl-C, a cancelled await: the attempt's
                    request = steps.throw(thrown)
                else:
                    request = steps.send(reply)
            except StopIteration as done:
                return done.value
