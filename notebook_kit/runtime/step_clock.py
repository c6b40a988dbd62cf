"""Where one rank's steps go: waiting for data, computing, waiting on the other ranks.

:class:`StepClock` times each step of the training thread (the loader's ``__next__``, a DDP
backward's wait for its all-reduce, the collectives the runtime makes during the step) on the
CPU clock or, on a GPU, between CUDA events read later without a sync.
:func:`watch_gradients` puts the one hook a timed backward needs on a model. The counts beside
the clock, and the rates the kernel makes of both, are in
:mod:`notebook_kit.runtime.throughput` and :mod:`notebook_kit.live.speed`.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Any

__all__ = ["StepClock", "watch_gradients"]


class StepClock:
    """Where one rank's steps go: waiting for data, computing, waiting on the other ranks.

    A step runs from one batch handed out by the training loader to the next (or to the end
    of the pass); in a hand-written loop, from one ``log(samples=...)`` to the next. Its parts:

    * data: the time the training thread spent in the loader's ``__next__``;
    * wait: the time the rank sat blocked on collectives the strategy can see: with DDP, from
      the moment its last gradient was computed until ``backward`` returned, its all-reduce of
      every bucket done (communication that overlaps computation is not waiting); and the
      collectives the runtime makes during the step (:meth:`waited`: the Stop vote, a
      checkpoint's agreement between ranks), where a faster rank waits for a slower one;
    * compute: what remains of the step.

    On the CPU the clock is ``time.perf_counter``. On a GPU the step and the wait are measured
    between CUDA events recorded on the stream, read on the metrics thread once they have
    passed (``query()``), never with a sync; the data wait stays on the CPU clock, since the
    loader runs there. Every total is a running sum, so the kernel can average any window.
    """

    __slots__ = (
        "_asked",
        "_began",
        "_done",
        "_owner",
        "_pending",
        "_ready",
        "_waited",
        "cuda",
        "data_seconds",
        "profiling",
        "sees_data",
        "sees_wait",
        "step_seconds",
        "steps",
        "wait_seconds",
    )

    def __init__(self, cuda_index: int | None = None) -> None:
        self.cuda = cuda_index is not None
        self.steps = 0
        self.step_seconds = 0.0
        self.data_seconds = 0.0
        self.wait_seconds = 0.0
        self.sees_data = False  # a prepared loader is being timed
        self.sees_wait = False  # a strategy reports its collectives
        self._asked: float | None = None  # when the training thread asked for a batch
        self._began: Any = None  # when the current step began: a time, or a CUDA event
        self._ready: Any = None  # the current step's backward: every gradient computed
        self._done: Any = None  # ... and backward returned, its reductions done
        self._waited = 0.0  # seconds of the current step in the runtime's collectives
        self._owner: int | None = None  # the thread that runs the steps
        # notebook_kit.profile()'s order, put here by the rank's signal thread and carried out
        # at the boundaries below (worker/step_profiler.py); None: one attribute read a step.
        self.profiling: Any = None
        self._pending: collections.deque[tuple[Any, Any, float, Any, Any, float]] = (
            collections.deque()
        )

    def asking(self) -> None:
        """The training thread asks the loader for its next batch."""
        self._asked = time.perf_counter()

    def handed(self) -> None:
        """The loader hands a batch out: the step before it ends, the next one begins."""
        now = time.perf_counter()
        asked = self._asked
        self.sees_data = True
        self._next_step(now - asked if asked is not None else 0.0, now)

    def pass_ended(self, ran_out: bool = True) -> None:
        """The pass ended: when the loader ran out (not a ``break``), its last step ends here.
        No step runs until the next pass."""
        ended = ran_out and self._asked is not None and self._began is not None
        if ended:
            self._end_step(self._stamp(), time.perf_counter() - self._asked)
        if self.profiling is not None:
            self.profiling.boundary(self, ended, False)
        self._began = self._asked = None
        self._waited = 0.0  # a step cut short by a break: its waits go with it

    def step_ended(self) -> None:
        """A step of a hand-written loop ended (no loader: no data wait is known)."""
        self._next_step(0.0)

    def time_backward(self, loss: Any, **kwargs: Any) -> None:
        """``loss.backward(**kwargs)``, timing the wait at its end.

        The first watched gradient of the pass (:func:`watch_gradients`) queues a callback
        with the autograd engine, which runs it once every gradient is computed, before the
        callbacks queued later: DDP's, queued when its last bucket is ready, which waits for
        the all-reduce. The wait runs from that moment until ``backward`` returns. A pass in
        which no watched gradient is computed has no wait: its step is all compute.
        """
        global _timing
        _timing = self
        try:
            loss.backward(**kwargs)
        finally:
            _timing = None
        self.backward_returned()

    def gradients_computed(self) -> None:
        """Every gradient of the backward pass is computed: the wait for the others begins."""
        self._ready = self._stamp()

    def backward_returned(self) -> None:
        """The backward pass returned, its gradient reductions done: the wait ends."""
        self.sees_wait = True
        self._done = self._stamp()
        if self.profiling is not None and self._began is None:  # nothing else marks the steps
            self.profiling.boundary(self, True, True)  # here: each backward ends one

    def waited(self, seconds: float) -> None:
        """The training thread sat ``seconds`` in a collective the runtime made during the
        step (the Stop vote, a checkpoint's agreement): the others' lateness is this rank's
        wait, not its compute. Ignored between steps and on any other thread (a background
        save agrees on a thread of its own while the steps go on). On a GPU this is the time
        the CPU was blocked, as the data wait is."""
        if self._began is not None and threading.get_ident() == self._owner:
            self._waited += seconds

    def _next_step(self, data: float, now: float | None = None) -> None:
        """End the step running (``data``: the wait for the batch that ends it, inside it)
        and begin the next; the wait for a pass's first batch is before any step."""
        stamp = self._stamp() if self.cuda or now is None else now
        if self.profiling is not None:  # profile(): its steps start, are marked and end here
            self.profiling.boundary(self, self._began is not None, True)
        if self._began is not None:
            self._end_step(stamp, data)
        else:  # once a pass: the thread that steps is the one whose waits count
            self._owner = threading.get_ident()
        self._began = stamp

    def _end_step(self, stamp: Any, data: float) -> None:
        ready, done, waited = self._ready, self._done, self._waited
        self._ready = self._done = None
        self._waited = 0.0
        if self.cuda:
            self._pending.append((self._began, stamp, data, ready, done, waited))
            return
        wait = done - ready if ready is not None and done is not None and done > ready else 0.0
        self._add(stamp - self._began, data, wait + waited)

    def _add(self, step: float, data: float, wait: float) -> None:
        self.steps += 1
        self.step_seconds += step
        self.data_seconds += min(data, step)
        self.wait_seconds += min(wait, max(step - data, 0.0))

    def _stamp(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def settle(self, wait: bool = False) -> None:
        """Add the GPU steps whose events have passed (metrics thread; ``wait``: all of them)."""
        pending = self._pending
        while pending:
            began, ended, data, ready, done, waited = pending[0]
            events = [e for e in (ended, done) if e is not None]
            if not all(event.query() for event in events):
                if not wait or _syncs_forbidden():  # still on the GPU: the next snapshot
                    return
                for event in events:  # the end of the run: wait for the last steps
                    event.synchronize()
            pending.popleft()
            try:
                step = began.elapsed_time(ended) / 1000
                timed = ready is not None and done is not None
                gap = ready.elapsed_time(done) / 1000 if timed else 0.0
            except RuntimeError:  # an event of a step cut short (a pass that never computed)
                continue
            self._add(step, data, max(gap, 0.0) + waited)


_timing: StepClock | None = None  # the clock of the backward pass running, until it is queued
_watched: weakref.WeakSet[Any] = weakref.WeakSet()  # parameters with the hook below


def watch_gradients(model: Any) -> None:
    """Let a timed backward learn when ``model``'s gradients are done: a hook on the parameter
    whose gradient a backward pass computes first (the last one declared) queues the clock's
    callback. One hook per model, kept for its life: a hook put on the loss at every step
    cost about 30 us of a 1 ms backward, this one under 10 us.

    Example::

        watch_gradients(ddp_model.module)
    """
    last = next((p for p in reversed(list(model.parameters())) if p.requires_grad), None)
    if last is None or last in _watched:
        return
    last.register_post_accumulate_grad_hook(_first_gradient)
    _watched.add(last)


def _first_gradient(_parameter: Any) -> None:
    global _timing
    clock = _timing
    if clock is not None:  # a timed pass: the first watched gradient queues, once
        _timing = None
        import torch

        torch.autograd.Variable._execution_engine.queue_callback(clock.gradients_computed)


def _syncs_forbidden() -> bool:
    import torch

    return bool(torch.cuda.get_sync_debug_mode())  # the user asked to hear of every sync
