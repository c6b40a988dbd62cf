"""A node's answer to ``notebook_kit.stacks()`` asked in the kernel of a cluster run.

The kernel's request reaches the node process as a :class:`~notebook_kit.node.protocol.StacksAsk`
on its orders pipe (the node task read it from the control value). The node process asks its
own run exactly as a local ``stacks()`` does (:mod:`notebook_kit.launch.stack_requests`: the
ranks' signal, py-spy's native frames here, on the node), on a thread of its own so the run's
loop never waits; the loop's observer sends the texts home at its next tick as one event.
"""

from __future__ import annotations

import queue
import threading

from notebook_kit.launch.stack_requests import NO_RUN, current_desk, gather
from notebook_kit.node.protocol import NodeStacks, StacksAsk

__all__ = ["NodeStackAnswers"]


class NodeStackAnswers:
    """Gathers this node's stacks for each request, off the loop; :meth:`ready` hands them on.

    Example::

        answers = NodeStackAnswers(node=1)
        answers.ask(StacksAsk(3, 1.0))       # on the loop's thread, from its observer
        for event in answers.ready():        # at a later tick
            relay.send(event)
    """

    def __init__(self, node: int) -> None:
        self.node = node
        self._done: queue.SimpleQueue[NodeStacks] = queue.SimpleQueue()

    def ask(self, order: StacksAsk) -> None:
        """Start gathering; the answer is queued by the deadline whatever the ranks do."""
        try:
            desk = current_desk()
        except RuntimeError:
            self._done.put(NodeStacks(self.node, order.number, {}, NO_RUN))
            return
        request = desk.submit(order.seconds)  # taken by the loop at its next turn

        def collect() -> None:
            answer = gather(desk, order.seconds, request)
            self._done.put(NodeStacks(self.node, order.number, dict(answer), answer.note or ""))

        threading.Thread(target=collect, name="notebook_kit-stacks-node", daemon=True).start()

    def ready(self) -> list[NodeStacks]:
        """The answers gathered since the last call."""
        done = []
        while not self._done.empty():
            done.append(self._done.get())
        return done
