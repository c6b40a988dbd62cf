"""A cluster node's side of a rank's pdb: its prompts asked in the kernel's cell, not here.

A node process has no cell and no terminal: the local desk
(:class:`~notebook_kit.launch.debugger_desk.DebuggerDesk`) would find nobody to ask and have
the rank skip its ``breakpoint()``. On a node the supervisor gets a :class:`RelayedDesk`
instead. Each prompt and each "left pdb" goes home as an urgent event; the kernel's cluster
loop asks the prompts in the cell, one rank at a time, with its own desk, and sends each line
typed back as a sealed :class:`~notebook_kit.node.protocol.DebuggerAnswer` on the run's
command topic (pushed to every node task, which passes it on the orders pipe). The node's
loop reads it at its next tick and the supervisor writes it on the rank's answer pipe.

Runs on a node, in the node process.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from notebook_kit.launch.debugger_desk import Answer, DebuggerDesk
from notebook_kit.node.protocol import DebuggerAnswer, NodeEvent
from notebook_kit.runtime.messages import DebuggerLeft, DebuggerPrompt

__all__ = ["RelayedDesk"]


class RelayedDesk(DebuggerDesk):
    """The prompts of this node's ranks, sent home; the kernel's lines, given to the ranks.

    Example::

        desk = RelayedDesk(relay.send)
        desk.receive(prompt)               # the supervisor: a rank's prompt goes home
        desk.take(DebuggerAnswer(1, line)) # the relay: a line came from the kernel
        desk.turn(answer)                  # the supervisor: written on rank 1's answer pipe
    """

    def __init__(self, send: Callable[[NodeEvent], None]) -> None:
        super().__init__()
        self.send = send
        self.prompted: set[int] = set()  # ranks whose prompt the kernel has not answered
        self.lines: collections.deque[DebuggerAnswer] = collections.deque()

    def ranks(self) -> set[int]:
        """This node's ranks at a pdb prompt: waiting for the kernel's line, not stuck."""
        return set(self.prompted)

    def receive(self, message: DebuggerPrompt | DebuggerLeft) -> None:
        """A rank's prompt, or its leaving pdb: sent home at once (an urgent event)."""
        if isinstance(message, DebuggerLeft):
            self.prompted.discard(message.rank)
        else:
            self.prompted.add(message.rank)
        self.send(message)

    def take(self, answer: DebuggerAnswer) -> None:
        """A line typed in the kernel's cell; kept for the next :meth:`turn` if it is for a
        rank of this node at its prompt (every node hears every line)."""
        if answer.rank in self.prompted:
            self.lines.append(answer)

    def forget(self, rank: int) -> None:
        """``rank`` died: nothing more is written to it (its exit tells the kernel the rest)."""
        self.prompted.discard(rank)

    def turn(self, answer: Answer) -> float:
        """Write the lines that came to their ranks; nobody waits here, so no time is spent."""
        while self.lines:
            line = self.lines.popleft()
            if line.rank in self.prompted:
                self.prompted.discard(line.rank)  # its next prompt, if any, comes anew
                answer(line.rank, line.line)
        return 0.0
