"""``notebook_kit.stacks()`` and ``profile()`` during a cluster run: the kernel's side.

The kernel cannot signal a rank on another machine. It raises the ``stacks`` number of the
control value it publishes (with the seconds a node gets); each node task reads the value
within a quarter second and passes the request to its node process, which asks its own ranks
as a local run does and sends their texts home as one urgent event
(:mod:`notebook_kit.launch.node_process.node_stacks`). The request here collects one answer per
node; a node that does not answer by the deadline gets a line for each of its ranks. A
``profile()`` request travels in the same value (its number, steps, seconds and the folder on
each node); each node answers with its ranks' profiles, tables and timelines included (the
traces stay on the node's disk, where its ranks wrote them).
"""

from __future__ import annotations

import time
from typing import Protocol

from notebook_kit.launch.profile_requests import ProfileRequest, RunDesk
from notebook_kit.launch.stack_requests import StackRequest
from notebook_kit.node.protocol import NodeProfiles, NodeStacks, ProfileAsk

__all__ = ["ClusterStackDesk", "ClusterStackRequest"]

# The share of the time left that a node's ranks get: the rest carries the request out (a
# control read) and the answer home (an event batch) before the kernel's deadline.
_NODE_SHARE = 0.5


class _Attempt(Protocol):
    def ask_stacks(self, seconds: float) -> int: ...

    def ask_profile(self, ask: ProfileAsk) -> None: ...

    def rank_nodes(self) -> tuple[int, ...]: ...


class ClusterStackRequest(StackRequest):
    """One ``stacks()`` request to every node of a cluster run: the nodes answer, not ranks."""

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self._number = -1
        self._rank_nodes: tuple[int, ...] = ()
        self._texts: dict[int, str] = {}
        self._nodes: set[int] = set()
        self._notes: list[str] = []

    def ask(self, attempt: _Attempt) -> None:  # type: ignore[override]
        """On the kernel's loop: publish the request for every node."""
        seconds = max(0.05, (self.deadline - time.monotonic()) * _NODE_SHARE)
        with self._lock:
            self._rank_nodes = attempt.rank_nodes()
            self._number = attempt.ask_stacks(seconds)
        self.asked.set()

    def answer(self, event: NodeStacks) -> None:  # type: ignore[override]
        """On the kernel's loop: one node's texts (an answer to an older request is not ours)."""
        with self._lock:
            if event.number != self._number or event.node in self._nodes:
                return
            self._nodes.add(event.node)
            self._texts.update({int(rank): text for rank, text in event.texts.items()})
            if event.note and event.note not in self._notes:
                self._notes.append(event.note)
            if self._nodes >= set(self._rank_nodes):
                self.answered.set()

    def pids(self) -> dict[int, int]:
        """None here: the ranks' processes are on other machines (their node reads them)."""
        return {}

    def texts(self, native: dict[int, str]) -> dict[int, str]:
        with self._lock:
            texts, rank_nodes = dict(self._texts), self._rank_nodes
        why = self.ended or f"no answer from its node within {self.timeout:g} s"
        for rank, node in enumerate(rank_nodes):
            texts.setdefault(rank, f"rank {rank} (node {node}): {why}")
        return texts

    def note(self, native_found: bool) -> str | None:
        """What the nodes said their texts leave out (py-spy missing there), once each."""
        with self._lock:
            return "\n".join(self._notes) or None


class ClusterProfileRequest(ProfileRequest):
    """One ``profile()`` request to every node of a cluster run."""

    _attempt: _Attempt | None = None

    def ask(self, attempt: _Attempt) -> None:  # type: ignore[override]
        """On the kernel's loop: publish the request; every rank of the run is asked."""
        seconds = max(0.05, (self.deadline - time.monotonic()) * _NODE_SHARE)
        self._attempt, self._rank_nodes = attempt, attempt.rank_nodes()
        self._pids = dict.fromkeys(range(len(self._rank_nodes)), 0)
        attempt.ask_profile(ProfileAsk(self.number, self.steps, seconds, str(self.folder)))
        self.asked.set()
        self._check()

    def node_answer(self, event: NodeProfiles) -> None:
        """On the kernel's loop: one node's profiles, or why its ranks could not be asked."""
        if event.number != self.number:
            return
        if event.error:
            ranks = [rank for rank, node in enumerate(self._rank_nodes) if node == event.node]
            self.why_not.update(dict.fromkeys(ranks, event.error))
        for rank, done in event.done.items():
            self.profiled(int(rank), done)
        self._check()

    def cancel(self) -> None:
        """The caller stops waiting: the nodes' ranks still profiling stop at their next step."""
        if self._attempt is not None:
            self._attempt.ask_profile(ProfileAsk(self.number, 0, 0.0, str(self.folder)))


class ClusterStackDesk(RunDesk):
    """The desk of a cluster run: its requests go out through the control value."""

    stack_request = ClusterStackRequest
    profile_request = ClusterProfileRequest

    def on_node_profiles(self, event: NodeProfiles) -> None:
        """On the loop's thread: a node's answer, for every profile request still open."""
        for request in self._open:
            if isinstance(request, ClusterProfileRequest):
                request.node_answer(event)
