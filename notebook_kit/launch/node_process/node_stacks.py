"""A node's answers to ``notebook_kit.stacks()`` and ``profile()`` asked in the kernel of a
cluster run.

The kernel's request reaches the node process as a :class:`~notebook_kit.node.protocol.StacksAsk`
or :class:`~notebook_kit.node.protocol.ProfileAsk` on its orders pipe (the node task read it
from the control value). The node process asks its own run exactly as a local ``stacks()`` or
``profile()`` does (:mod:`notebook_kit.launch.stack_requests`,
:mod:`notebook_kit.launch.profile_requests`: the ranks' signals, py-spy's native frames and the
traces here, on the node), on a thread of its own so the run's loop never waits; the loop's
observer sends the answer home at its next tick as one event.
"""

from __future__ import annotations

import queue
import threading
import time

from notebook_kit.launch.profile_requests import ProfileRequest, post_profile
from notebook_kit.launch.stack_requests import NO_RUN, current_desk, gather
from notebook_kit.node.protocol import NodeProfiles, NodeStacks, ProfileAsk, StacksAsk
from notebook_kit.runtime.messages import ProfileDone

__all__ = ["ASKS", "NodeStackAnswers"]

ASKS = (StacksAsk, ProfileAsk)  # what the kernel asks of a node's ranks while they run


class NodeStackAnswers:
    """Gathers this node's answers to each request, off the loop; :meth:`ready` hands them on.

    Example::

        answers = NodeStackAnswers(node=1)
        answers.ask(StacksAsk(3, 1.0))       # on the loop's thread, from its observer
        for event in answers.ready():        # at a later tick
            relay.send(event)
    """

    def __init__(self, node: int) -> None:
        self.node = node
        self._done: queue.SimpleQueue[NodeStacks | NodeProfiles] = queue.SimpleQueue()
        self._profiles: dict[int, ProfileRequest] = {}  # by the kernel's request number

    def ask(self, order: StacksAsk | ProfileAsk) -> None:
        """Start gathering; the answer is queued by the deadline whatever the ranks do."""
        if isinstance(order, ProfileAsk):
            self._profile(order)
            return
        try:
            desk = current_desk()
        except RuntimeError:
            self._done.put(NodeStacks(self.node, order.number, {}, NO_RUN))
            return
        request = desk.submit(order.seconds)  # taken by the loop at its next turn

        def collect() -> None:
            answer = gather(desk, order.seconds, request)
            self._done.put(NodeStacks(self.node, order.number, dict(answer), answer.note or ""))

        threading.Thread(target=collect, name="notebook_kit-asked-node", daemon=True).start()

    def _profile(self, order: ProfileAsk) -> None:
        if order.steps == 0:  # the kernel stopped waiting: the ranks stop at their next step
            if (asked := self._profiles.pop(order.number, None)) is not None:
                asked.cancel()
            return
        try:
            request = post_profile(order.steps, order.seconds, order.folder)
        except RuntimeError as error:
            self._done.put(NodeProfiles(self.node, order.number, {}, str(error)))
            return
        self._profiles[order.number] = request

        def collect() -> None:
            request.answered.wait(max(0.0, request.deadline - time.monotonic()))
            if request.missing():  # the kernel names them: they stop at their next step
                request.cancel()
            done = {
                rank: ProfileDone(
                    order.number, r.steps, str(r.trace), r.table, r.step_spans, r.spans
                )
                for rank, r in request.results.items()
            }
            why_not = {**request.why_not, **request.errors}
            done.update(
                {rank: ProfileDone(order.number, error=why) for rank, why in why_not.items()}
            )
            self._done.put(NodeProfiles(self.node, order.number, done))

        threading.Thread(target=collect, name="notebook_kit-asked-node", daemon=True).start()

    def ready(self) -> list[NodeStacks | NodeProfiles]:
        """The answers gathered since the last call (this is their only reader: none waits)."""
        return [self._done.get() for _ in range(self._done.qsize())]
