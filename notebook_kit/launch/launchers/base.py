"""The one interface every way of running a launch implements (see :class:`Launcher`)."""

from __future__ import annotations

import abc
import functools
from collections.abc import Generator
from typing import Any

from notebook_kit.config.launch_plan import LaunchPlan
from notebook_kit.launch.plan import Call
from notebook_kit.launch.warmup import import_whole
from notebook_kit.live.display import default_observer, prepare_live_view
from notebook_kit.live.observer import LaunchObserver

__all__ = ["Launcher", "Steps", "WaitRequest", "prepare_view"]

WaitRequest = tuple[list[Any], float]  # for ``multiprocessing.connection.wait``: objects, timeout
Steps = Generator[WaitRequest, list[Any], Any]


class Launcher(abc.ABC):
    """One way to run a checked plan: in this kernel, in forked workers, under torchrun, ...

    The boundary: the launcher is handed a plan that was fully checked (nothing has started
    yet, and a bad argument was already refused) and the user's call. From :meth:`run` on it
    owns everything it starts, and it must:

    - start the processes the plan asks for (or run here, where the processes already exist);
    - deliver what they send to the observer as typed calls, from the kernel's main thread:
      ``on_start`` once per attempt (as soon as the banner is known, without holding up the
      start), ``on_output``/``on_metrics`` as data arrives, ``on_tick`` at least every quarter
      second, ``on_finish`` once per attempt whatever its outcome;
    - stop every process on an exception thrown into its steps (Ctrl-C, a cancelled ``await``),
      and raise ``TimeoutError`` after ``plan.timeout``; the Stop button only sets
      ``info.stop_flag``, which the function reads;
    - return rank 0's value and load its trained weights into the kernel's own models; on a
      failure raise :class:`~notebook_kit.errors.WorkerError` and leave those models untouched;
    - leave nothing behind once ``run`` ends, however it ends: no process, pipe or thread.

    ``run`` never waits itself: it yields what to wait on and receives what became ready, so
    the blocking and the awaitable entry points drive every launcher with the same steps
    (:mod:`notebook_kit.launch.launchers.driver`). A new way to run is one more subclass, and
    one more line in :func:`~notebook_kit.launch.launchers.driver.select_launcher`.
    """

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan

    @abc.abstractmethod
    def run(self, call: Call, observer: LaunchObserver | None) -> Steps:
        """Run ``call``; a generator that yields ``(objects, timeout)`` and returns the value.

        ``observer`` None: the default view for ``plan.live``, made by :meth:`view`.
        """

    def view(self, observer: LaunchObserver | None) -> LaunchObserver:
        """The caller's observer, or the default view (built when the launcher asks for it)."""
        if observer is not None:
            return observer
        prepare_view(self.plan.live)
        return default_observer(self.plan.live)


def prepare_view(live: bool | None) -> None:
    """Import the default view's modules now, whole: Ctrl-C meanwhile stops the launch, never
    an import (one cut short leaves matplotlib broken until the kernel restarts)."""
    import_whole(functools.partial(prepare_live_view, live))
