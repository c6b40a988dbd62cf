"""The pool's way to run: the forked launcher's workers, kept after the run instead of ended.

The fork is the forked launcher's own (:meth:`ForkedLauncher.fork`: guardian, pipes, death
signal, supervisor); what differs is what the workers run, the pool's command loop, and that
they stay. So :meth:`PersistentLauncher.run` waits only until every rank has formed the group
and said so, and returns the running workers instead of a value. Each later run is a command
they serve (:meth:`~notebook_kit.launch.pool.workers.PoolProcesses.execute`), with a loop of its
own: there an interrupt is relayed to the workers as a message, not an end of everything.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
import weakref
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from notebook_kit.config.launch_plan import LaunchPlan
from notebook_kit.launch.forking import NodeSeat
from notebook_kit.launch.launchers.base import Steps
from notebook_kit.launch.launchers.forked import ForkedLauncher
from notebook_kit.launch.plan import Call
from notebook_kit.launch.pool.backend import WorkersStopped
from notebook_kit.launch.warmup import wait_for_warmup
from notebook_kit.live.observer import LaunchObserver
from notebook_kit.worker.pool.command_loop import PoolChannels, serve_pool

if TYPE_CHECKING:  # (the processes start through this module: PoolProcesses.start)
    from notebook_kit.launch.pool.workers import PoolProcesses

__all__ = ["PersistentLauncher", "let_go"]

_TICK_SECONDS = 0.25
_READY_SLACK = 30.0  # beyond the rendezvous timeout, to import and form the group

_kernel_ends: weakref.WeakSet[Connection] = weakref.WeakSet()


def _close_kernel_ends() -> None:
    """In any child forked from the kernel: a pool's write ends are not the child's to hold."""
    for connection in list(_kernel_ends):
        with contextlib.suppress(OSError):
            connection.close()
    _kernel_ends.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_kernel_ends)


def let_go(channels: PoolChannels) -> None:
    """The workers are gone: close the kernel's write ends of their pipes."""
    for connection in (*channels.senders, *channels.interrupters):
        _kernel_ends.discard(connection)
        connection.close()


class PersistentLauncher(ForkedLauncher):
    """Forked workers that stay: ``run`` returns them running, ready for commands."""

    def __init__(
        self,
        plan: LaunchPlan,
        processes: PoolProcesses,
        generation: int,
        seat: NodeSeat | None = None,
    ) -> None:
        super().__init__(plan, seat)  # seat: one node of a cluster pool
        self.processes = processes
        self.generation = generation

    def call(self) -> Call:
        """The workers' function, the command loop, with a command and an interrupt pipe each."""
        count = self.plan.num_processes
        commands = [multiprocessing.Pipe(duplex=False) for _ in range(count)]
        interrupts = [multiprocessing.Pipe(duplex=False) for _ in range(count)]
        channels = PoolChannels(
            commands=[reader for reader, _ in commands],
            interrupts=[reader for reader, _ in interrupts],
            senders=[writer for _, writer in commands],
            interrupters=[writer for _, writer in interrupts],
        )
        # The kernel's write ends: closed in every child forked from now on.
        _kernel_ends.update(channels.senders + channels.interrupters)
        self.processes.channels = channels
        return serve_pool, (channels,), {}

    def run(self, call: Call, observer: LaunchObserver | None) -> Steps:
        """Fork, then wait until every rank reported it is ready; stop them all on any error.

        The pool's relay is the observer: each run's view is attached to it later.
        """
        processes = self.processes
        try:
            processes.alive = True
            wait_for_warmup()  # here Ctrl-C stops the start; inside os.fork it is swallowed
            try:
                self.fork(
                    call, processes.supervisor, processes.stop_flag, frozenset(), self.generation
                )
            finally:
                assert processes.channels is not None
                processes.channels.close_readers()
            deadline = time.monotonic() + self.plan.rendezvous_timeout + _READY_SLACK
            while len(processes.relay.ready) < self.plan.num_processes:
                processes.raise_if_dead("while starting")
                if time.monotonic() > deadline:
                    raise WorkersStopped("the workers did not form their process group in time", [])
                processes.serve((yield processes.supervisor.waitables(), _TICK_SECONDS))
        except BaseException:
            processes.kill()
            raise
        return processes
