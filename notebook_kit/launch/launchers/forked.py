"""Forked workers: the guardian forks ``num_processes`` workers from the kernel, supervised here.

The view is built while the workers start, not before: the fork comes first (a few ms), then
the observer (the live view's widgets take tens of ms) is made and told, while the workers
import and meet. Nothing they send is lost meanwhile: it waits in their pipes, which the wait
loop reads only once the view is there, so it is drawn once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Generator
from typing import Any

from notebook_kit.config.launch_plan import LaunchPlan
from notebook_kit.errors import WorkerError
from notebook_kit.launch.forking import NodeSeat, fork_workers, open_listener
from notebook_kit.launch.interrupts import interrupt_taken, interrupts_deferred, interrupts_held
from notebook_kit.launch.kernel_models import find_kernel_models, load_home_weights
from notebook_kit.launch.launchers.base import Launcher, Steps, WaitRequest, prepare_view
from notebook_kit.launch.plan import Call
from notebook_kit.launch.preflight import check_fork_safety, check_not_in_a_launch, start_route
from notebook_kit.launch.restarts import AttemptEnding, RestartPolicy
from notebook_kit.launch.supervisor import LaunchOutcome, Supervisor
from notebook_kit.launch.template import TemplateRoute
from notebook_kit.launch.template_wire import SharedStopFlag
from notebook_kit.launch.warmup import wait_for_warmup
from notebook_kit.live.observer import LaunchInfo, LaunchObserver, LaunchSummary
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.weights_file import WeightsFile, read_states

__all__ = ["ForkedLauncher"]


class ForkedLauncher(Launcher):
    """``num_processes`` forked workers, started again after a failure up to ``max_restarts``.

    Example::

        value = run_blocking(ForkedLauncher(plan).run(call, observer=None))

    ``seat`` places this node in a run whose nodes something else started (a cluster run's
    node process): node 0's bound socket, the store prefix, and where rank 0's weights go.
    Rank 0 writes the trained weights into ``weights_file``, opened for the launch when it has
    models to bring home and inherited by every worker at the fork.
    """

    def __init__(
        self, plan: LaunchPlan, seat: NodeSeat | None = None, restarts_before: int = 0
    ) -> None:
        super().__init__(plan)
        self.seat = seat
        self.restarts_before = restarts_before  # a cluster node's: the kernel's count so far
        self.weights_file: WeightsFile | None = None
        self.route: TemplateRoute | None = None  # set when the workers start from the template

    def run(self, call: Call, observer: LaunchObserver | None) -> Steps:
        kernel_models = find_kernel_models(*call)
        # The kernel runs nothing between attempts: decided once. A call that cannot be
        # shipped is refused here, before anything starts.
        self.route = self._route(call, kernel_models)
        if kernel_models:
            self.weights_file = WeightsFile()
        try:
            if self.route is not None:
                yield from self.route.wait_ready()
            return (yield from self._attempts(call, observer, kernel_models))
        finally:
            if self.weights_file is not None:
                self.weights_file.close()

    def _route(self, call: Call, kernel_models: dict[int, Any]) -> TemplateRoute | None:
        """None to fork from the kernel; else the way through its clean template process.

        A cluster's node process (``seat``) was itself started clean: it always forks.
        """
        if self.seat is not None:
            check_not_in_a_launch()
            check_fork_safety(self.plan.kernel)
            return None
        reason = start_route(self.plan.kernel, "notebook_launcher", self.plan.start_method)
        return None if reason is None else TemplateRoute(reason, call, kernel_models)

    def _attempts(
        self, call: Call, observer: LaunchObserver | None, kernel_models: dict[int, Any]
    ) -> Steps:
        if observer is None:
            prepare_view(self.plan.live)  # imported before the fork, built after it
        shown: list[LaunchObserver] = []  # built once, at the first fork, kept for restarts

        def view() -> LaunchObserver:
            if not shown:
                shown.append(self.view(observer))
            return shown[0]

        policy = RestartPolicy(
            self.plan.max_restarts,
            self.plan.timeout,
            run="launch",
            everyone="all workers",
            agrees_batch_size=self.seat is None,  # a cluster's kernel restarts its nodes
        )

        def attempt(restart: int) -> Generator[WaitRequest, list[Any], AttemptEnding]:
            one = _Attempt(self, call, view, kernel_models, restart)
            error: BaseException | None = None
            try:
                one.start()
                while (limit := one.supervisor.wait_limit()) is not None:
                    one.supervisor.serve((yield one.supervisor.waitables(), limit))
            except BaseException as raised:
                error = raised
                if isinstance(raised, KeyboardInterrupt):
                    interrupt_taken()  # the launch ends for it: more presses only repeat it
            return one.finish(error)

        return (yield from policy.run_attempts(attempt))

    def fork(
        self,
        call: Call,
        supervisor: Supervisor,
        stop_flag: StopFlag,
        home_model_ids: frozenset[int],
        restart_count: int,
    ) -> None:
        """Fork the guardian and the workers that run ``call``, watched by ``supervisor``.

        The step every forked way to run shares: a one-off launch, and the pool's workers.
        """
        if self.route is not None:
            assert isinstance(stop_flag, SharedStopFlag)
            supervisor.guardian = self.route.fork(
                self.plan,
                stop_flag.fd,
                self.weights_file.fd if self.weights_file is not None else None,
                restart_count,  # never a cluster node's (those fork): no count from before
                supervisor.workers,
            )
            return
        with open_listener(self.plan, self.seat) or contextlib.nullcontext() as listener:
            supervisor.guardian = fork_workers(
                call,
                self.plan,
                listener,
                stop_flag,
                home_model_ids,
                supervisor.workers,
                self.restarts_before + restart_count,
                self.seat,
                self.weights_file.fd if self.weights_file is not None else None,
            )


class _Attempt:
    """One attempt of a launch: ``start``, a wait loop over ``supervisor``, then ``finish``."""

    def __init__(
        self,
        launcher: ForkedLauncher,
        call: Call,
        view: Callable[[], LaunchObserver],
        kernel_models: dict[int, Any],
        restart_count: int,
    ) -> None:
        self.launcher = launcher
        self.call = call
        self.restart_count = restart_count
        self.plan: LaunchPlan = launcher.plan
        self.view = view
        self.observer: LaunchObserver | None = None  # told once the workers are forked
        self.stop_flag = SharedStopFlag() if launcher.route is not None else StopFlag()
        self.supervisor = Supervisor([], _NOT_YET_SHOWN)
        self.kernel_models = kernel_models
        self._started: float | None = None  # set once the observer has been told

    def start(self) -> None:
        """Fork every worker, then build and tell the view while they start.

        Ctrl-C is held until the guardian is known, so nothing forked escapes the cleanup.
        """
        info = self._info()  # built before interrupts are held: nothing sized by the plan runs then
        if self.launcher.weights_file is not None:
            self.launcher.weights_file.clear()  # what an earlier attempt wrote
        # The fork waits for the warm-up imports anyway (an at-fork hook), but Ctrl-C during a
        # wait inside os.fork is swallowed: wait here, where it interrupts the launch.
        wait_for_warmup()
        with interrupts_deferred():
            started = time.monotonic()
            self.launcher.fork(
                self.call,
                self.supervisor,
                self.stop_flag,
                frozenset(self.kernel_models),
                self.restart_count,
            )
            self.observer = self.supervisor.observer = self.view()
            self.observer.on_start(info)
            self._started = started
        self.supervisor.start_clock(self.plan.timeout, self.plan.stall_seconds)

    def _info(self) -> LaunchInfo:
        ranks = tuple(self.plan.global_rank(i) for i in range(self.plan.num_processes))
        banner = self.plan.banner()
        if self.launcher.route is not None:  # which way the workers start, and why
            reason = self.launcher.route.reason
            banner += f". {reason[0].upper()}{reason[1:]}: starting workers from a clean process"
        return LaunchInfo(
            banner,
            self.plan.num_processes,
            self.plan.world_size,
            ranks,
            self.stop_flag,
        )

    def finish(self, error: BaseException | None) -> AttemptEnding:
        """Stop what still runs, tell the observer, and say how the attempt ended.

        Ctrl-C during the clean-up waits for it, then ends the launch as interrupted: the
        summary says so and one KeyboardInterrupt is raised after it.
        """
        with interrupts_held() as held:
            self.supervisor.shutdown()
        if held.pressed and error is None:
            error = KeyboardInterrupt()
        outcome = self.supervisor.outcome()
        try:
            if self._started is not None and self.observer is not None:
                self.observer.on_finish(self._summary(outcome, error, self._started))
        finally:
            with interrupts_deferred():
                self.supervisor.release()  # the guardian's exit overlapped with on_finish
            self.stop_flag.close()
        failure = WorkerError(outcome.failures, self.plan.world_size) if outcome.failures else None
        result = outcome.result
        return AttemptEnding(
            error=error,
            timed_out=outcome.timed_out,
            failure=failure,
            value=result.value if result is not None else None,
            bring_home=(lambda: self._bring_home(result.weights)) if result is not None else None,
        )

    def _bring_home(self, weights: Any) -> None:
        """Rank 0's weights into the kernel's models (and the seat's, on a cluster's node)."""
        home = self.launcher.weights_file
        fd = home.fd if home is not None else None
        if self.launcher.route is not None and weights:  # keyed by the template's models
            weights = self.launcher.route.kernel_weights(weights)
        if self.launcher.seat is not None:
            self.launcher.seat.weights.update(read_states(fd, weights))
        load_home_weights(self.kernel_models, weights, fd)

    def _summary(
        self, outcome: LaunchOutcome, error: BaseException | None, started: float
    ) -> LaunchSummary:
        return LaunchSummary(
            ranks=self.supervisor.rank_summaries(),
            duration=time.monotonic() - started,
            failures=tuple(outcome.failures),
            timed_out=outcome.timed_out,
            interrupted=isinstance(error, (KeyboardInterrupt, asyncio.CancelledError)),
            stopped=self.stop_flag.is_set(),
            error=error,
        )


class _NotYetShown(LaunchObserver):
    """The supervisor's observer until the view exists: the loop reads nothing before it, and
    the protocol's methods do nothing."""


_NOT_YET_SHOWN = _NotYetShown()
