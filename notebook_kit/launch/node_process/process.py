"""The node process: one node of a cluster run, forked for its node task by a zygote.

:func:`main` (``ORDERS_FD EVENTS_FD``; :mod:`notebook_kit.node.zygote` calls it) reads its
:class:`~notebook_kit.node.protocol.NodeOrder` from the first pipe, runs today's launcher for
this node's ranks (guardian, forked ranks, thread budget, fork-safety checks and GPU choice as
on one machine), and writes its events and outcome to the second. Node 0 binds its rendezvous
port itself, on its own address, and tells the task, which publishes it: no fixed port, and
no gap between choosing the port and listening on it.
"""

from __future__ import annotations

import dataclasses
import signal
import socket
import traceback
from multiprocessing.connection import Connection

import cloudpickle

from notebook_kit.config.launch_plan import LaunchPlan, auto_threads
from notebook_kit.errors import WorkerError
from notebook_kit.launch.forking import NodeSeat
from notebook_kit.launch.node_process.launch import launch_node, prints_to_kernel
from notebook_kit.launch.node_process.relay import RelayObserver
from notebook_kit.launch.plan import make_plan
from notebook_kit.launch.preflight import open_rendezvous_socket
from notebook_kit.node.protocol import (
    ADDRESS,
    OUTCOME,
    NodeError,
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

__all__ = ["main", "node_plan", "node_threads"]


def main(argv: list[str]) -> int:
    """Run the node described on the orders pipe; the exit code is 0 unless the pipe broke."""
    _take_signals()
    orders, events = Connection(int(argv[0])), Connection(int(argv[1]), readable=False)
    seal = Seal(orders.recv_bytes())  # the run's secret, then the order it seals
    order = decode(orders.recv_bytes(), NodeOrder, seal=seal)
    outcome = _run(order, orders, events, seal)
    events.send_bytes(OUTCOME + encode(outcome, seal))
    return 0


def _run(order: NodeOrder, orders: Connection, events: Connection, seal: Seal) -> NodeOutcome:
    """This node's launch, and how it ended.

    Every node process starts at once; the others import and unpickle while node 0 binds,
    then read node 0's address from their orders pipe.
    """
    try:
        (function, args, kwargs), models = cloudpickle.loads(order.payload)
        seat = NodeSeat(order.store_prefix)
        if order.node_rank == 0:
            seat.listener = _rendezvous_listener(order.host)
            master = Rendezvous(order.host, seat.listener.getsockname()[1])
            events.send_bytes(ADDRESS + encode(master, seal))
        else:
            master = decode(orders.recv_bytes(), Rendezvous, seal=seal)
        plan = node_plan(order, master)
        relay = RelayObserver(order.node_rank, orders, events, seal)
        # A preempted VM or a SLURM job at its limit is told with SIGTERM: the ranks get to
        # save (should_stop() turns True everywhere) before the machine goes.
        signal.signal(signal.SIGTERM, lambda signum, frame: relay.preempt())
        with prints_to_kernel(relay):
            if order.pool:
                from notebook_kit.launch.node_process.pooling import serve_node_pool

                return serve_node_pool(plan, relay, seat, orders)
            value = launch_node((function, args, kwargs), plan, relay, seat, order.restart_count)
    except WorkerError as error:
        return NodeFailed(tuple(error.failures))
    except KeyboardInterrupt:
        return NodeInterrupted()
    except BaseException as error:
        return NodeError(type(error).__qualname__, str(error), traceback.format_exc())
    if order.node_rank != 0:  # only global rank 0's value and weights go home
        return NodeValue()
    weights = {
        index: seat.weights[id(model)]
        for index, model in enumerate(models)
        if id(model) in seat.weights
    }
    return NodeValue(value, weights)


def node_plan(order: NodeOrder, master: Rendezvous) -> LaunchPlan:
    """This node's plan, from the run's typed settings and what the cluster chose for it."""
    config = order.settings.config.replace(
        threads_per_process=node_threads(order),
        num_nodes=order.num_nodes,
        node_rank=order.node_rank,
        max_restarts=0,  # the kernel restarts every node together
        master_addr=master.host,  # as node 0 bound it (a loopback one included)
        master_port=master.port,
    )
    plan = make_plan(
        config,
        rendezvous_timeout=order.settings.rendezvous_timeout,
        stall_seconds=order.settings.stall_seconds,
    )
    settings = order.settings
    return dataclasses.replace(
        plan, post_mortem=settings.post_mortem, collective_timeout=settings.collective_timeout
    )


def node_threads(order: NodeOrder) -> int:
    """Torch threads per rank on this node: ``threads_per_process`` if given, else this host's
    cores shared out among the ranks of every node of the run on it.

    A local launch divides the cores between its ranks; several nodes on one host (several
    Dask workers of one machine) share them the same way, as the ranks of one launch would,
    instead of each node sizing its ranks as if it had the host to itself.

    Example:
        >>> from notebook_kit import LaunchConfig
        >>> from notebook_kit.node.protocol import NodeSettings
        >>> config = LaunchConfig(num_processes=1, threads_per_process=3)
        >>> order = NodeOrder("run", 0, 2, "h", None, b"", NodeSettings(config, 60, None), "p/")
        >>> node_threads(order)
        3
    """
    explicit = order.settings.config.threads_per_process
    if explicit is not None:
        return explicit
    ranks_on_host = order.settings.num_processes * max(order.host_nodes, 1)
    return auto_threads(ranks_on_host)


def _rendezvous_listener(host: str) -> socket.socket:
    """Node 0's rendezvous socket on its own address: IPv6 (``::1``) as well as IPv4."""
    if ":" not in host:
        return open_rendezvous_socket(host, None)
    return socket.create_server((host, 0), family=socket.AF_INET6, backlog=1024)


def _take_signals() -> None:
    """Receive SIGINT and SIGTERM as a process started from a shell does.

    A child inherits the signal mask of the thread that started it, and an engine's worker may
    block signals there: a Ray worker blocks SIGINT in the thread that runs its tasks. The node
    task ends this process with SIGINT (abort, lease), which would then never arrive: after
    the grace the process is killed and its node reported lost without its outcome.
    """
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # inherited as ignored: Python
        signal.signal(signal.SIGINT, signal.default_int_handler)  # left it so at start-up
