"""``notebook_kit.stacks()`` while the run executes in this very process.

With one process the function runs in the kernel itself (and under torchrun, in each job
process), so there is no worker to signal and no loop that turns: the request is answered at
once, from this process's own frames of the thread that runs the function. Signalling this
process instead would end it, since nothing here waits for that signal.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from notebook_kit.launch.stack_requests import StackDesk, StackRequest
from notebook_kit.worker.stacks import current_stacks

__all__ = ["stacks_here"]


class _HereDesk(StackDesk):
    """A desk whose one rank is the thread running the function here."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.thread = threading.get_ident()

    def submit(self, timeout: float) -> Any:
        request = StackRequest(timeout)
        request.answer_here(self.rank, current_stacks(only=self.thread))
        return request


@contextlib.contextmanager
def stacks_here(rank: int) -> Iterator[None]:
    """While the block runs the function on this thread, ``stacks()`` shows it as ``rank``."""
    desk = _HereDesk(rank)
    desk.open(lambda limit: False)  # nothing to turn: every request is answered at once
    try:
        yield
    finally:
        desk.close("the run ended")
