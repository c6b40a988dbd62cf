"""``WorkerPool(cluster=client)``: every node's ranks stay forked and grouped between runs.

One :class:`~notebook_kit.launch.cluster.attempt.ClusterAttempt`, started with ``pool=True``,
lasts the pool's life: each node task keeps its node process, which keeps its ranks
(:mod:`notebook_kit.launch.cluster.node_pool`). A run is one order broadcast to every node as a
Dask event (in order, none lost); each node answers with an event carrying its ranks' answers.
The attempt's loop still watches the nodes (a lost worker, silence, the kernel's lease), so a
node that goes away ends the pool, and the kernel's death ends every node through the lease.

Runs in the kernel.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from notebook_kit.config import arguments
from notebook_kit.errors import WorkerFailure
from notebook_kit.launch.cluster.attempt import ClusterAttempt
from notebook_kit.launch.cluster.cluster_plan import ClusterPlan
from notebook_kit.launch.cluster.connect import choose_workers, current_workers
from notebook_kit.launch.cluster.failures import ClusterWorkerError
from notebook_kit.launch.cluster.probing import check_reports, probe_workers
from notebook_kit.launch.interrupts import interrupt_taken
from notebook_kit.launch.pool.results import STILL_RUNNING, decode_value, failures_of
from notebook_kit.launch.pool.shipping import (
    DEFAULT_SEND_LIMIT,
    WorkerHoldings,
    hidden_names,
    names_used_by,
)
from notebook_kit.live.observer import Stream
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch, PoolAnswer

__all__ = ["ClusterPool", "ClusterPoolError", "unsupported"]

_START_SLACK = 60.0  # beyond the rendezvous timeout: node processes import torch and fork
_ANSWER_SECONDS = 10.0  # after an interrupt or a check: how long the nodes get to answer
_CLOSE_SECONDS = 10.0
_TICK_SECONDS = 0.1
CLOSED = "The pool was closed on every node (everything defined on the ranks is lost); create a new WorkerPool."  # noqa: E501


class ClusterPoolError(ClusterWorkerError):
    """A cluster pool's run failed on a rank; names it, its node, and what became of the pool."""

    def __init__(
        self,
        failures: list[WorkerFailure],
        world_size: int,
        nodes: list[str],
        aftermath: str,
        lost_nodes: tuple[int, ...] = (),
    ) -> None:
        self.aftermath = aftermath
        super().__init__(failures, world_size, nodes, lost_nodes)

    def _format(self) -> str:
        """The cluster launch's message, saying what became of the pool instead of a launch's
        "the other workers were stopped" (its second line, whatever follows it)."""
        lines = super()._format().split("\n")
        return "\n".join([lines[0], *lines[2:], "", self.aftermath])


def unsupported(call: str, instead: str) -> NotImplementedError:
    return NotImplementedError(f"{call} is not supported with cluster= yet; {instead}")


class _Forward:
    """The attempt's observer: the nodes' lines and metrics go to the run being shown."""

    def __init__(self) -> None:
        self.view: Any = None

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        if self.view is not None:
            self.view.on_output(rank, stream, line)
        else:
            print(f"[rank {rank}] {line}", flush=True)

    def on_metrics(self, batch: MetricsBatch) -> None:
        if self.view is not None:
            self.view.on_metrics(batch)

    def on_tick(self) -> None:
        if self.view is not None:
            self.view.on_tick()


def _ready() -> None:
    """The function the probe rebuilds on each worker (a pool's nodes run commands instead)."""


class ClusterPool:
    """The nodes of a cluster pool, from start to close (``WorkerPool(cluster=...)``)."""

    def __init__(self, plan: ClusterPlan, rendezvous_timeout: float) -> None:
        client, settings = plan.client, dict(plan.settings)
        workers = choose_workers(current_workers(client), plan.num_nodes)
        payload = cloudpickle.dumps(((_ready, (), {}), []))
        reports = probe_workers(client, workers, payload)
        check_reports(reports)
        if settings["num_processes"] is None:  # one per GPU of node 0, as for a launch
            settings["num_processes"] = max(reports[0].gpus, 1)
        self.num_processes = int(settings["num_processes"])
        self.world_size = self.num_processes * len(reports)
        self.workers = [report.worker for report in reports]
        self.closed = False
        self._forward = _Forward()
        self._stop_flag = StopFlag()
        self._attempt = ClusterAttempt(
            client, reports, payload, settings, self._forward, self._stop_flag, pool=True
        )
        self._seq = 0
        main = sys.modules["__main__"].__dict__
        self._holdings = WorkerHoldings(main, hidden_names(), DEFAULT_SEND_LIMIT)
        try:
            self._attempt.start()
            deadline = time.monotonic() + rendezvous_timeout + _START_SLACK
            while len(self._attempt.ready) < len(reports):
                self._step("while starting")
                if time.monotonic() > deadline:
                    raise self._end(
                        [], f"the nodes did not form their process group within "
                        f"{rendezvous_timeout + _START_SLACK:g} s"
                    )  # fmt: skip
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """Every rank's process id, node by node (empty once closed)."""
        if self.closed:
            return []
        return [pid for node in sorted(self._attempt.ready) for pid in self._attempt.ready[node]]

    def run(self, function: Callable[..., Any], args: tuple, kwargs: dict, ranks: Any) -> Any:
        """``function(*args, **kwargs)`` on every rank; rank 0's value (``"all"``: every rank's)."""
        self._check_open()
        wanted = (
            list(range(self.world_size))
            if ranks == "all"
            else [arguments.check_int("ranks", ranks, minimum=0, maximum=self.world_size - 1)]
        )
        # As for a local pool: functions of kernel cells are rebuilt in the ranks' namespace
        # (a global one run sets is there for the next), and the kernel globals they use are
        # sent once; nothing of the kernel was inherited by a node.
        names = set().union(*(names_used_by(v) for v in (function, *args, *kwargs.values())))
        shipped = self._holdings.needed(names)
        request = {"shipped": shipped, "call": (function, args, kwargs), "home": {}}
        body = self._holdings.dumps(request, "pool.run")
        answers, interrupted = self._order("run", "call", body, wanted)
        for name, value in shipped.items():
            self._holdings.remember(name, value)
        faulted = interrupted or any(a.status != "ok" for a in answers.values())
        if faulted:  # do all ranks of all nodes still meet? (every node checks at once)
            self._order("check")
        if interrupted:
            print("Interrupted on every rank of every node; the ranks keep their state.")
            raise KeyboardInterrupt
        failures = failures_of(answers)
        if failures:
            raise ClusterPoolError(failures, self.world_size, self.workers, STILL_RUNNING)
        values = [decode_value(answers[rank].value, rank, for_display=False) for rank in wanted]
        return values if ranks == "all" else values[0]

    def close(self) -> None:
        """Every node's ranks leave the group and exit; nothing stays on any worker."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._attempt.ready:
                self._attempt.command("close")
        finally:
            self._attempt.finish(grace=_CLOSE_SECONDS)
            self._stop_flag.close()

    # -- orders --------------------------------------------------------------------------

    def _order(self, *order: Any) -> tuple[dict[int, PoolAnswer], bool]:
        """Send one order to every node and gather their answers (global rank: answer).

        A node's failed rank interrupts the other nodes' ranks; Ctrl-C interrupts them all.
        Workers that had to stop on any node, or a lost node, close the pool.
        """
        self._seq += 1
        seq = self._seq
        self._attempt.command(order[0], seq, *order[1:])
        answers: dict[int, PoolAnswer] = {}
        interrupted, interrupt_sent, settle = False, False, None
        nodes = len(self.workers)
        while True:
            try:
                got = {n: a for n, (s, a) in self._attempt.answers.items() if s == seq}
                for answer in got.values():
                    answers.update(answer.get("answers", {}))
                stopped = [a for a in got.values() if a["status"] == "stopped"]
                if stopped:
                    failures = failures_of(answers) + list(stopped[0]["failures"])
                    raise self._end(failures, str(stopped[0]["reason"]))
                if len(got) == nodes:  # (a node's ranks interrupted for a rank elsewhere:
                    return answers, interrupted  # that rank's error is the run's)
                failed = any(a.status != "ok" for a in answers.values())
                if (failed or interrupted) and not interrupt_sent:
                    interrupt_sent = True
                    self._attempt.command("interrupt", seq)
                if (failed or interrupted or order[0] == "check") and settle is None:
                    settle = time.monotonic() + _ANSWER_SECONDS
                if settle is not None and time.monotonic() > settle:
                    late = sorted(set(range(nodes)) - set(got))
                    raise self._end(
                        failures_of(answers),
                        f"node {', '.join(map(str, late))} did not answer within "
                        f"{_ANSWER_SECONDS:g} s",
                    )
                self._step("during the run")
            except KeyboardInterrupt:
                interrupt_taken()
                interrupted = True

    def _step(self, when: str) -> None:
        running = self._attempt.step(_TICK_SECONDS)
        if self._attempt.abort or not running:
            failures = list(self._attempt.result.failures)
            raise self._end(failures, f"a node ended {when} ({self._attempt.abort or 'ended'})")

    def _end(self, failures: list[WorkerFailure], reason: str) -> BaseException:
        """Close the pool on every node; the error that says why."""
        lost = tuple(self._attempt.result.lost_nodes)
        self.close()
        if not failures:
            return RuntimeError(f"The cluster pool stopped: {reason}. {CLOSED}")
        return ClusterPoolError(
            failures, self.world_size, self.workers, f"{reason}. {CLOSED}", lost
        )

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("This WorkerPool is closed; create a new one.")
