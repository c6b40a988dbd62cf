"""Where a launch's workers start from: the kernel itself (a fork), or its clean template.

Forking is only safe while the kernel holds no CUDA context and no process group
(:func:`~notebook_kit.launch.preflight.fork_hazard`). When it holds one, the launch asks the
kernel's template process (:mod:`notebook_kit.launch.template_process`: a fresh interpreter
that imported torch and nothing of the user's) to fork the guardian instead, with the call
shipped by value (:mod:`notebook_kit.launch.template_shipping`). The template sends back the
kernel's ends of every pipe, so the supervisor, the live view, Stop, interrupts and the weights
coming home work as in a forked launch.

In a kernel the template is started at ``import notebook_kit``
(:mod:`notebook_kit.launch.template_start`), so the first launch that needs it finds it ready;
elsewhere by that first launch. It is kept for the kernel's later launches; one that died is
replaced by the next launch. It ends with the kernel.

:func:`set_start_method` (:mod:`notebook_kit.launch.template_choice`) chooses between the
two: ``"auto"`` (the default), ``"fork"`` or ``"template"``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Generator
from multiprocessing.connection import Connection
from typing import Any

from notebook_kit.config.launch_plan import LaunchPlan
from notebook_kit.launch.guardian_link import GuardianLink
from notebook_kit.launch.line_reader import LineReader
from notebook_kit.launch.supervisor import WorkerProcess
from notebook_kit.launch.template_shipping import ship_call
from notebook_kit.launch.template_start import (
    early_template_pid,
    spawn_template,
    take_early_template,
)
from notebook_kit.launch.template_wire import ForkReply, ForkRequest, Ready, receive, send
from notebook_kit.worker.guardian import Call

__all__ = [
    "TemplateError",
    "TemplateRoute",
    "end_template",
    "start_template",
    "template_pid",
]


class TemplateError(RuntimeError):
    """The template process could not start a launch's workers."""


class _Template:
    """The kernel's handle on its template process and the socket to it."""

    def __init__(self, started: tuple[subprocess.Popen[bytes], socket.socket] | None = None):
        # The one made at `import notebook_kit` in a kernel, else a new one.
        self.process, self.sock = started or take_early_template() or spawn_template()
        self.ready = False
        self._asking = threading.Lock()  # one request and its reply at a time on the socket

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready_steps(self) -> Generator[tuple[list[Any], float], list[Any], None]:
        """Wait (as a launcher's steps, so Ctrl-C stops the launch) for its imports."""
        while not self.ready:
            if not self.alive():
                raise TemplateError(
                    f"The clean process that starts the workers exited while starting (exit "
                    f"code {self.process.returncode}); its error is in the kernel's log."
                )
            ready = yield [self.sock], 0.25
            if ready:
                message, fds = receive(self.sock)
                _close_all(fds)
                self.ready = isinstance(message, Ready)

    def fork(self, request: ForkRequest, fds: list[int]) -> tuple[ForkReply, list[int]]:
        try:
            with self._asking:
                send(self.sock, request, fds)
                reply, ends = receive(self.sock)
        except (OSError, EOFError) as error:
            raise TemplateError(
                f"The clean process that starts the workers is gone ({error}); the next launch "
                "starts a new one."
            ) from error
        if not isinstance(reply, ForkReply) or reply.error is not None:
            _close_all(ends)
            raise TemplateError(f"The clean process could not start the workers: {reply.error}")
        return reply, ends

    def close(self) -> None:
        self.sock.close()  # its end of file ends the template
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(2.0)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


_template: _Template | None = None
_lock = threading.Lock()


def start_template() -> None:
    """Start the kernel's template process now (it imports in the background), if it has none.

    Example::

        start_template()  # in the import cell: the first template launch finds it ready
    """
    _kernel_template()


def _kernel_template() -> _Template:
    """The kernel's template, started now if there is none or it died."""
    global _template
    with _lock:
        if _template is None or not _template.alive():
            if _template is not None:
                _template.sock.close()
                _template.process.wait()
            _template = _Template()
        return _template


@atexit.register
def end_template() -> None:
    """End the kernel's template process, if it has one (at exit; a later launch makes a new
    one when it needs it).

    Example::

        end_template()
        assert template_pid() is None
    """
    global _template
    with _lock:
        if _template is None and (early := take_early_template()) is not None:
            _template = _Template(early)  # the one made at import, never adopted: ended too
        if _template is not None:
            _template.close()
        _template = None


def template_pid() -> int | None:
    """The pid of the kernel's template process while one runs, else None.

    Example::

        start_template()
        os.kill(template_pid(), 0)  # it runs
    """
    template = _template
    if template is None:
        return early_template_pid()  # made at import, not adopted by a launch yet
    return template.process.pid if template.alive() else None


class TemplateRoute:
    """One launch's way through the template: the shipped call, and its models' two ids.

    Built before anything starts, so what cannot be shipped is named first.

    Example::

        route = TemplateRoute(fork_hazard(), call, find_kernel_models(*call))
        yield from route.wait_ready()
        supervisor.guardian = route.fork(plan, stop_flag.fd, None, 0, supervisor.workers)
    """

    def __init__(self, reason: str, call: Call, kernel_models: dict[int, Any]) -> None:
        self.reason = reason
        self.models = list(kernel_models.values())
        self.kernel_ids = list(kernel_models)
        self.passed: list[int] = []  # the call's own descriptors (a pool's pipes), sent along
        self.payload = ship_call(call, self.models, reason, self.passed)
        self.template = _kernel_template()
        self.home_ids: dict[int, int] = {}  # the template's id of each model -> the kernel's

    def wait_ready(self) -> Generator[tuple[list[Any], float], list[Any], None]:
        """The launcher's steps until the template serves forks."""
        self.template = _kernel_template()
        yield from self.template.ready_steps()

    def fork(
        self,
        plan: LaunchPlan,
        stop_flag_fd: int,
        weights_fd: int | None,
        restart_count: int,
        workers: list[WorkerProcess],
    ) -> GuardianLink:
        """Have the template fork the guardian; ``workers`` gets one handle per worker."""
        request = ForkRequest(
            payload=self.payload,
            plan=plan,
            restart_count=restart_count,
            env=dict(os.environ),
            path=tuple(sys.path),
            cwd=os.getcwd(),
            has_weights=weights_fd is not None,
            argv=tuple(sys.argv),
        )
        fds = [stop_flag_fd] + ([weights_fd] if weights_fd is not None else []) + self.passed
        reply, ends = self.template.fork(request, fds)
        self.home_ids = dict(zip(reply.model_ids, self.kernel_ids, strict=True))
        link = _AdoptedGuardian(reply.pid, ends[0], ends[1])
        os.set_blocking(link.status_fd, False)
        at = 2
        for rank, answers in zip(reply.ranks, reply.answers, strict=True):
            workers.append(_handle(rank, ends[at : at + 4 if answers else at + 3]))
            at += 4 if answers else 3
        return link

    def kernel_weights(self, weights: dict[int, Any]) -> dict[int, Any]:
        """Rank 0's weights, keyed by the template's ids, keyed by the kernel's models."""
        return {self.home_ids[i]: state for i, state in weights.items() if i in self.home_ids}


class _AdoptedGuardian(GuardianLink):
    """A guardian the template forked: the template reaps it, the kernel waits until it has."""

    def _alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def _reap(self) -> None:
        """The template, its parent, reaps it."""


def _handle(rank: int, fds: list[int]) -> WorkerProcess:
    """The kernel's handle on a worker, from its ends as the template sent them."""
    for fd in fds[:2]:
        os.set_blocking(fd, False)
    return WorkerProcess(
        rank=rank,
        pid=0,
        stdout=LineReader(fds[0], rank, "stdout"),
        stderr=LineReader(fds[1], rank, "stderr"),
        messages=Connection(fds[2], writable=False),
        answers=Connection(fds[3], readable=False) if len(fds) > 3 else None,
    )


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
