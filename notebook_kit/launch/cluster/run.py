"""``notebook_launcher(..., cluster=...)``: one call runs every node of a Dask or Ray cluster.

Everything that can be checked is checked before a rank starts: the options, the workers
(one per node), and each worker itself (versions, network, whether the function can be
rebuilt there). Then each attempt runs every node at once; ``max_restarts`` starts all nodes
again after a failure, and every ending leaves the cluster ready for the next launch.

``cluster_plan`` checks the options, :func:`cluster_steps` runs: a launcher's steps (see
:class:`~notebook_kit.launch.launchers.base.Launcher`), which yield what to wait on, so the
blocking and the awaited entry points drive a cluster run as they drive a local one
(``ClusterLauncher`` in :mod:`notebook_kit.launch.launchers.cluster`).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Generator
from typing import Any

import cloudpickle

from notebook_kit.errors import choose_root_cause
from notebook_kit.launch.cluster.attempt import END_GRACE_SECONDS as _END_GRACE_SECONDS
from notebook_kit.launch.cluster.attempt import AttemptResult, ClusterAttempt
from notebook_kit.launch.cluster.cluster_plan import ClusterPlan, check_cluster_mesh
from notebook_kit.launch.cluster.engine import Engine
from notebook_kit.launch.cluster.failures import ClusterWorkerError
from notebook_kit.launch.cluster.probing import check_reports
from notebook_kit.launch.interrupts import interrupt_taken
from notebook_kit.launch.kernel_models import find_kernel_models, load_home_weights
from notebook_kit.launch.plan import Call
from notebook_kit.launch.pool.shipping import DEFAULT_SEND_LIMIT, SendTooLargeError
from notebook_kit.launch.restarts import AttemptEnding, RestartPolicy
from notebook_kit.live.display import default_observer
from notebook_kit.live.observer import LaunchInfo, LaunchObserver, LaunchSummary
from notebook_kit.node.protocol import NodeSettings, ProbeReport
from notebook_kit.runtime.context import StopFlag

__all__ = ["cluster_steps"]

_TICK_SECONDS = 0.1
_WAIT_SECONDS = 0.5  # how often the workers present are read while too few are there
_NOTICE_SECONDS = 0.5  # a failure whose run takes longer to end is named before the error

Steps = Generator[tuple[list[Any], float], list[Any], Any]  # as a launcher's steps


def cluster_steps(call: Call, plan: ClusterPlan, observer: LaunchObserver | None) -> Steps:
    """Run ``call`` on every node of the plan's cluster; rank 0's value is the return value.

    Models the function reaches get rank 0's trained weights. Raises ``ClusterWorkerError``
    (a ``WorkerError``) for a failed rank or a lost node, ``TimeoutError`` after ``timeout``
    or when fewer than ``min_nodes`` workers remain for a restart, ``KeyboardInterrupt`` on
    Ctrl-C (or what else is thrown into the steps).
    """
    engine = plan.engine
    models = list(find_kernel_models(*call).values())
    nodes = _Nodes(engine, call, models, engine.choose(plan.num_nodes, plan.min_nodes))
    settings = plan.settings.with_processes(nodes.reports[0].gpus)  # as on one machine
    observer = observer or default_observer(plan.live)
    policy = RestartPolicy(
        plan.max_restarts,
        plan.timeout,
        run="cluster run",
        everyone=f"all {len(nodes.reports)} nodes" if plan.min_nodes is None else "the nodes",
    )
    lost: set[str] = set()  # workers of the last attempt's lost nodes: never chosen again
    failures: list[BaseException] = []  # what ended each attempt

    def attempt(restart: int) -> Generator[tuple[list[Any], float], list[Any], AttemptEnding]:
        if restart:
            try:
                chosen = yield from _choose_again(engine, plan, len(nodes.reports), lost)
            except TimeoutError as error:
                raise error from failures[-1]
            nodes.use(chosen)
        reports = nodes.reports
        check_cluster_mesh(settings, reports)  # the nodes are counted: before any starts
        result, error = yield from _attempt(
            engine, reports, nodes.payload, settings, observer, plan.timeout, restart
        )
        lost.update(reports[node].worker for node in result.lost_nodes)
        failure = _error(result, reports, settings, engine.worker_noun) if result.failures else None
        if failure is not None:
            failures.append(failure)
        return AttemptEnding(
            error=error,
            timed_out=result.timed_out,
            failure=failure,
            value=result.value,
            bring_home=lambda: load_home_weights(dict(enumerate(models)), result.weights),
        )  # the weights are global rank 0's, its models in the order found here

    return (yield from policy.run_attempts(attempt))


class _Nodes:
    """The workers an attempt runs on, with the payload shipped and each probed for them."""

    def __init__(self, engine: Engine, call: Call, models: list[Any], workers: list[str]) -> None:
        self.engine, self.call, self.models = engine, call, models
        self.workers: list[str] = []
        self.use(workers)

    def use(self, workers: list[str]) -> None:
        """Run the next attempt on ``workers``; ship and probe again only when they changed."""
        if workers == self.workers:
            return
        self.payload = _payload(
            self.call, self.models, functools.partial(self.engine.ship, workers)
        )
        self.reports = self.engine.probe(workers, self.payload)
        check_reports(self.reports, self.engine.worker_noun, self.engine.ship_hint)
        self.workers = workers


def _choose_again(
    engine: Engine, plan: ClusterPlan, before: int, lost: set[str]
) -> Generator[tuple[list[Any], float], list[Any], list[str]]:
    """The workers of a restart: from ``min_nodes`` to ``num_nodes`` of those there now (a
    lost node's worker left out), waiting up to ``rendezvous_timeout`` for enough to join.

    Raises:
        TimeoutError: Fewer than ``min_nodes`` workers were there when the wait ended.
    """
    most = plan.num_nodes or before
    least = plan.min_nodes or most
    if plan.min_nodes is not None:
        setting, fix = f"min_nodes={least}", "lower min_nodes"
    else:
        setting, fix = f"num_nodes={least}", "pass min_nodes= to restart on fewer nodes"
    bound = plan.settings.rendezvous_timeout
    deadline = time.monotonic() + bound
    said = False
    while True:
        usable = len(engine.present() - lost)
        chosen = None
        if usable >= least:
            with contextlib.suppress(ValueError):  # one left between the two reads: read again
                chosen = engine.choose(min(usable, most), least, exclude=lost)
        if chosen is not None:
            if len(chosen) != before:
                print(
                    f"The restart runs on {len(chosen)} "
                    f"{'node' if len(chosen) == 1 else 'nodes'} (was {before}).",
                    flush=True,
                )
            return chosen
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"The cluster run needs {setting} {engine.worker_noun}s to restart, "
                f"but {usable} {'was' if usable == 1 else 'were'} there after waiting "
                f"rendezvous_timeout={bound:g} s. {engine.grow_hint} or {fix}, "
                "then run the cell again: load_state() resumes from the last checkpoint."
            )
        if not said:
            said = True
            print(
                f"Waiting for {engine.worker_noun}s to restart on: {usable} of the "
                f"{setting} needed {'is' if usable == 1 else 'are'} there (waiting up "
                f"to rendezvous_timeout={bound:g} s).",
                flush=True,
            )
        yield [], _WAIT_SECONDS


def _payload(
    call: Call, models: list[Any], pickle: Callable[[Any], bytes] = cloudpickle.dumps
) -> bytes:
    """The function, its arguments and the models, pickled together (identity kept) by
    ``pickle``: for a launch, so that every chosen worker's node process can rebuild them."""
    payload = pickle((call, models))
    if len(payload) > DEFAULT_SEND_LIMIT:
        raise SendTooLargeError(
            f"The function and its arguments pickle to {len(payload) >> 20} MiB, more than "
            f"the {DEFAULT_SEND_LIMIT >> 20} MiB sent to every node. Load large data on the "
            f"nodes inside the function (from a path or URL they can reach) instead."
        )
    return payload


def _attempt(
    engine: Engine,
    reports: list[ProbeReport],
    payload: bytes,
    settings: NodeSettings,
    observer: LaunchObserver,
    timeout: float | None,
    restart_count: int,
) -> Generator[tuple[list[Any], float], list[Any], tuple[AttemptResult, BaseException | None]]:
    """Run every node once; tell the observer; return how it ended and what was thrown in.

    It waits only by yielding: on the attempt's wake-up socket, which the nodes' events ring,
    for at most a tick, so the view ticks and the Stop button is read while nothing arrives.
    """
    stop_flag = StopFlag()
    attempt = ClusterAttempt(
        engine, reports, payload, settings, observer, stop_flag, restart_count=restart_count
    )
    world, banner = attempt.world_size, f"Launching {attempt.where()}"
    ranks = tuple(range(world))
    observer.on_start(LaunchInfo(banner, world, world, ranks, stop_flag, attempt.rank_nodes()))
    started = time.monotonic()
    error: BaseException | None = None
    try:
        attempt.start()
        while attempt.step(0.0):
            running_for = time.monotonic() - started - attempt.debugged  # (not at a pdb prompt)
            if timeout is not None and running_for > timeout:
                attempt.result.timed_out = True
                attempt.end_all("timeout")
                break
            if attempt.abort:
                break
            yield [attempt.wake], _TICK_SECONDS
        grace = time.monotonic() + _END_GRACE_SECONDS  # the others report how they ended
        notice = time.monotonic() + _NOTICE_SECONDS
        while time.monotonic() < grace and attempt.step(0.0):
            if attempt.result.failures and time.monotonic() >= notice:
                notice = grace  # once
                print(_failure_notice(attempt), flush=True)
            yield [attempt.wake], min(_TICK_SECONDS, grace - time.monotonic())
    except BaseException as raised:  # Ctrl-C: every node ends, then it is raised again
        error = raised
        if isinstance(raised, KeyboardInterrupt):
            interrupt_taken()  # the launch ends for it: more presses only repeat it
        attempt.end_all("interrupt")
    finally:
        attempt.finish(grace=2.0 if error is not None else 0.0)
        observer.on_finish(_summary(attempt.result, reports, settings, started, error))
        stop_flag.close()
    return attempt.result, error


def _failure_notice(attempt: ClusterAttempt) -> str:
    """The failed rank, named while the other nodes are still being ended: on many nodes that
    takes seconds, and the error that names it comes only once every node has reported."""
    root = choose_root_cause(attempt.result.failures)
    running = attempt.num_nodes - len(attempt.ended) - len(attempt.result.lost_nodes)
    why = f"{root.exception_type}: {root.message}" if root.exception_type else root.message
    node = root.rank // attempt.settings.num_processes
    return (
        f"Rank {root.rank} (node {node}) failed ({why.splitlines()[0] if why else 'no message'}"
        f"); ending the {running} {'node' if running == 1 else 'nodes'} still running."
    )


def _summary(
    result: AttemptResult,
    reports: list[ProbeReport],
    settings: NodeSettings,
    started: float,
    error: BaseException | None,
) -> LaunchSummary:
    return LaunchSummary(
        ranks=(),
        duration=time.monotonic() - started,
        failures=tuple(_error(result, reports, settings).failures) if result.failures else (),
        timed_out=result.timed_out,
        interrupted=error is not None,
        stopped=result.stopped,
        error=error,
    )


def _error(
    result: AttemptResult,
    reports: list[ProbeReport],
    settings: NodeSettings,
    noun: str = "Dask worker",
) -> ClusterWorkerError:
    world = settings.num_processes * len(reports)
    workers = [report.worker for report in reports]
    return ClusterWorkerError(result.failures, world, workers, result.lost_nodes, noun)
