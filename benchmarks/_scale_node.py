"""A simulated node process for ``benchmarks.scale``: its ranks are threads, without torch.

The node task (:mod:`notebook_kit.node.task`) has its zygote run this ``main`` in place of
:func:`notebook_kit.launch.node_process.process.main` (``NODE_PROCESS_MAIN``, which the
benchmark's workers set), with the same two pipes. It reads the same order, publishes the
same rendezvous (node 0), and writes the same frames through the real
:class:`~notebook_kit.launch.node_process.relay.RelayObserver`: everything from the node
task's relay to the kernel is the real code. What a real node's supervisor would do with its
ranks' pipes is done here on the main thread: each rank thread encodes its metrics batches
with the workers' codec (``runtime.messages.encode``) and writes its output lines as text; the
"supervisor" decodes them and hands them to the relay observer, which ticks (and so reads
Stop from the orders pipe) as a node's launcher does.

A rank stops at its next stop vote after the node's stop flag is set (the ranks of a real run
vote about ten times a second); it writes when it saw Stop into the run folder, which the
benchmark reads. One rank may fail on purpose (``fail_rank``): the node then reports the
failure as a node whose rank raised does (``NodeFinished`` with the failure, then
``NodeFailed``).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import cloudpickle

from notebook_kit.errors import WorkerFailure
from notebook_kit.launch.node_process.relay import RelayObserver
from notebook_kit.live.observer import LaunchInfo, LaunchSummary
from notebook_kit.node.protocol import (
    ADDRESS,
    OUTCOME,
    NodeFailed,
    NodeInterrupted,
    NodeOrder,
    NodeOutcome,
    NodeValue,
    Rendezvous,
    Seal,
    decode,
    encode,
)
from notebook_kit.runtime import messages
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch, Progress, RankSpeed

__all__ = ["ScaleSpec", "main", "simulated_rank"]

VOTE_SECONDS = 0.1  # a real run's ranks vote on Stop about ten times a second
_TICK_SECONDS = 0.1  # the node launcher's tick (it reads Stop from the orders pipe then)


@dataclass(frozen=True)
class ScaleSpec:
    """What every simulated rank does, sent to the nodes as the function's argument."""

    run_dir: str
    epoch: float  # time.time() the benchmark started: metric "sent" counts from it
    metrics_per_second: float = 2.0
    lines_per_second: float = 1.0
    records_per_batch: int = 1  # log() calls in each metrics batch
    fail_rank: int | None = None  # this global rank raises after fail_after seconds
    fail_after: float = 0.0


def simulated_rank(spec: ScaleSpec) -> None:
    """The launched function, as the kernel ships it; a simulated node never calls it."""
    raise RuntimeError(f"benchmarks.scale runs simulated nodes only ({spec.run_dir})")


def main(argv: list[str]) -> int:
    """The node process's entry, as the zygote calls it: ``ORDERS_FD EVENTS_FD``."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the task's abort, as a node's
    orders, events = Connection(int(argv[0])), Connection(int(argv[1]), readable=False)
    seal = Seal(orders.recv_bytes())
    order = decode(orders.recv_bytes(), NodeOrder, seal=seal)
    outcome = _run(order, orders, events, seal)
    events.send_bytes(OUTCOME + encode(outcome, seal))
    return 0


def _run(order: NodeOrder, orders: Connection, events: Connection, seal: Seal) -> NodeOutcome:
    (_function, args, _kwargs), _models = cloudpickle.loads(order.payload)
    spec: ScaleSpec = args[0]
    if order.node_rank == 0:  # node 0 publishes the rendezvous, as a real one binds it
        events.send_bytes(ADDRESS + encode(Rendezvous(order.host, 1), seal))
    else:
        decode(orders.recv_bytes(), Rendezvous, seal=seal)
    relay = RelayObserver(order.node_rank, orders, events, seal)
    node = _Node(order, spec, relay)
    try:
        return node.run()
    except KeyboardInterrupt:
        return NodeInterrupted()
    finally:
        node.finish()


class _Node:
    """The ranks' threads and the node launcher's loop over what they send."""

    def __init__(self, order: NodeOrder, spec: ScaleSpec, relay: RelayObserver) -> None:
        self.order, self.spec, self.relay = order, spec, relay
        per_node = order.settings.num_processes
        self.ranks = tuple(range(order.node_rank * per_node, (order.node_rank + 1) * per_node))
        self.stop_flag = StopFlag()
        self.ended = threading.Event()  # the launch ends the ranks (interrupt, a failure)
        self.pipe: queue.SimpleQueue[tuple[int, str, bytes]] = queue.SimpleQueue()
        self.stopped_at: dict[int, float] = {}  # rank -> time.time() it saw Stop
        self.failed_at: float | None = None
        self.started = time.monotonic()

    def run(self) -> NodeOutcome:
        world = self.order.settings.num_processes * self.order.num_nodes
        self.relay.on_start(LaunchInfo("", len(self.ranks), world, self.ranks, self.stop_flag))
        threads = [threading.Thread(target=self._rank, args=(r,), daemon=True) for r in self.ranks]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads) or not self.pipe.empty():
            self._supervise()
            if self.failed_at is not None:
                break
        failures = self._failures()
        self.relay.on_finish(
            LaunchSummary((), time.monotonic() - self.started, failures,
                          stopped=self.stop_flag.is_set())
        )  # fmt: skip
        if failures:
            return NodeFailed(failures)
        return NodeValue(len(self.stopped_at) if self.order.node_rank == 0 else None)

    def _supervise(self) -> None:
        """One turn of the node launcher: what the ranks sent, then a tick."""
        deadline = time.monotonic() + _TICK_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            try:
                rank, kind, data = self.pipe.get(timeout=left)
            except queue.Empty:
                break
            if kind == "metrics":
                batch = messages.decode(data)
                assert isinstance(batch, MetricsBatch)
                self.relay.on_metrics(batch)
            elif kind == "line":
                self.relay.on_output(rank, "stdout", data.decode().rstrip("\n"))
            elif kind == "failed":
                self.failed_at = float(data)
        self.relay.on_tick()

    def _failures(self) -> tuple[WorkerFailure, ...]:
        if self.failed_at is None:
            return ()
        self.ended.set()  # the guardian stops this node's other ranks
        rank = self.spec.fail_rank
        assert rank is not None
        message = f"simulated failure of rank {rank}"
        return (WorkerFailure(rank, 1, "RuntimeError", message, message, time.monotonic()),)

    def _rank(self, rank: int) -> None:
        """One rank: metrics batches and lines at their rates, a stop vote every 0.1 s."""
        spec, step = self.spec, 0
        due = {"metrics": 0.0, "line": 0.0, "vote": 0.0}
        period = {
            "metrics": 1 / spec.metrics_per_second,
            "line": 1 / spec.lines_per_second,
            "vote": VOTE_SECONDS,
        }
        failing = rank == spec.fail_rank
        while not self.ended.is_set():
            now = time.monotonic() - self.started
            if failing and now >= spec.fail_after:
                self.pipe.put((rank, "failed", repr(time.time()).encode()))
                return
            if now >= due["vote"] and self.stop_flag.is_set():
                self.stopped_at[rank] = time.time()
                return
            if now >= due["metrics"]:
                step = self._send_metrics(rank, step)
            if now >= due["line"]:
                line = f"step {step}: loss {1 / (step + 1):.4f}\n"
                self.pipe.put((rank, "line", line.encode()))
            for kind in due:
                while due[kind] <= now:
                    due[kind] += period[kind]
            self.ended.wait(max(0.0, min(due.values()) - (time.monotonic() - self.started)))

    def _send_metrics(self, rank: int, step: int) -> int:
        records = []
        for _ in range(self.spec.records_per_batch):
            sent = time.time() - self.spec.epoch
            records.append((rank, step, {"loss": 1 / (step + 1), "sent": sent}))
            step += 1
        speed = RankSpeed(samples=32 * step, batches=step, seconds=time.monotonic() - self.started)
        batch = MetricsBatch(rank, tuple(records), 0, Progress(steps=step), speed)
        self.pipe.put((rank, "metrics", messages.encode(batch)))
        return step

    def finish(self) -> None:
        """What the benchmark reads: when each rank saw Stop, when the failing rank raised."""
        self.ended.set()
        folder = Path(self.spec.run_dir)
        record = {"stopped": self.stopped_at, "failed": self.failed_at, "pid": os.getpid()}
        (folder / f"node-{self.order.node_rank}.json").write_text(json.dumps(record))
