"""A node's share of a cluster run: the launch its node process runs, with what differs from a
local launch because the kernel is on another machine.

- **Only global rank 0 reports home.** A local launch's ranks send their value and weights
  from each node's first rank; on a cluster, only node 0's first rank is global rank 0. On
  every other node the function runs as :class:`OffHomeCall`: its value is dropped on the
  rank, never pickled (as a non-zero rank's value in a local launch), and the rank's models
  are gathered with rank 0's (gathering a sharded model is a collective every rank joins)
  and then left out, so no weights leave the rank.
- **Restarts count as the kernel's.** The kernel starts every node again after a failure;
  each node's launcher numbers its ranks' ``NOTEBOOK_KIT_RESTART_COUNT`` from the kernel's
  count, as a local launch does.
- **pdb is the kernel's.** A rank's ``breakpoint()`` prompts in the kernel's cell: the node's
  supervisor sends each prompt home and writes the line typed there back to the rank
  (:mod:`notebook_kit.launch.node_process.node_debugger`).
- **What the launcher prints reaches the kernel.** The stall report (``stall_seconds``) and
  anything else the node process prints go to the kernel as ``print`` events, which it
  prints where a local launch would.

Runs on a node, in the node process.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from typing import Any

from notebook_kit.config.launch_plan import LaunchPlan
from notebook_kit.launch.forking import NodeSeat
from notebook_kit.launch.kernel_models import find_kernel_models
from notebook_kit.launch.launchers.base import Steps
from notebook_kit.launch.launchers.forked import ForkedLauncher
from notebook_kit.launch.node_process.relay import RelayObserver
from notebook_kit.launch.plan import Call
from notebook_kit.launch.supervisor import Supervisor
from notebook_kit.node.protocol import NodePrint
from notebook_kit.runtime.context import current_launch

__all__ = ["OffHomeCall", "launch_node", "prints_to_kernel"]


class OffHomeCall:
    """The function as the ranks of a node other than node 0 run it: nothing goes home.

    It exposes the function's closure and globals, so the launcher finds the same kernel
    models in it as node 0 does in the function itself, and every rank gathers the same
    sharded models in the same order.
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.__closure__ = getattr(function, "__closure__", None)
        self.__globals__ = getattr(function, "__globals__", {})

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.function(*args, **kwargs)
        context = current_launch()
        if context is not None:
            # Join rank 0's gathers now; then this rank holds no model to send home, and the
            # launcher's own gather after the function has nothing left to do here.
            context.gather_weights(find_kernel_models(self.function, args, kwargs))
            context.prepared_models = []
            context.gathered_weights = {}


def launch_node(
    call: Call, plan: LaunchPlan, relay: RelayObserver, seat: NodeSeat, restart_count: int
) -> Any:
    """Run this node's ranks; the value of global rank 0 (None on the other nodes)."""
    function, args, kwargs = call
    if plan.node_rank != 0:
        call = (OffHomeCall(function), args, kwargs)
    launcher = _NodeLauncher(plan, relay, seat, restarts_before=restart_count)
    return _run_waking_on_orders(launcher.run(call, relay), relay)


def _run_waking_on_orders(steps: Steps, relay: RelayObserver) -> Any:
    """``run_blocking``, whose every wait also ends when an order comes from the kernel.

    The loop reads the orders at each tick (the observer's ``on_tick``): a line typed at a
    rank's pdb prompt is written at once, not up to a tick later.
    """
    orders = relay.orders
    try:
        request = next(steps)
        while True:
            objects, limit = request
            try:  # (a closed pipe would end every wait at once: left out once it ends)
                ready = wait([*objects, *([] if relay.orders_ended else [orders])], limit)
            except BaseException as error:  # Ctrl-C: the launcher cleans up, then re-raises
                request = steps.throw(error)
            else:
                request = steps.send([obj for obj in ready if obj is not orders])
    except StopIteration as finished:
        return finished.value


class _NodeLauncher(ForkedLauncher):
    """A node's forked launch whose ranks' pdb prompts are asked in the kernel's cell."""

    def __init__(
        self, plan: LaunchPlan, relay: RelayObserver, seat: NodeSeat, restarts_before: int
    ) -> None:
        super().__init__(plan, seat, restarts_before)
        self.relay = relay

    def fork(self, call: Call, supervisor: Supervisor, *rest: Any) -> None:
        """As on one machine, with the supervisor's prompts sent home instead of asked here."""
        supervisor.debugger = self.relay.debugger
        super().fork(call, supervisor, *rest)


class _KernelPrint(io.TextIOBase):
    """``sys.stdout`` of the node process: each line goes to the kernel as a ``print`` event.

    A process forked from the node process (the guardian, before the ranks take their own
    streams) inherits it; only the node process itself sends.
    """

    def __init__(self, relay: RelayObserver) -> None:
        self._relay = relay
        self._pid = os.getpid()
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if os.getpid() == self._pid:
            *lines, self._pending = (self._pending + text).split("\n")
            for line in lines:
                self._relay.send(NodePrint(line))
        return len(text)

    def flush(self) -> None:
        if self._pending and os.getpid() == self._pid:
            self._relay.send(NodePrint(self._pending))
            self._pending = ""


@contextlib.contextmanager
def prints_to_kernel(relay: RelayObserver) -> Iterator[None]:
    """While inside, what the node process prints is printed in the kernel."""
    printer = _KernelPrint(relay)
    try:
        with contextlib.redirect_stdout(printer):
            yield
    finally:
        printer.flush()
