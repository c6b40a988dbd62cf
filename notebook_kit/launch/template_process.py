"""The clean template: a fresh interpreter that forks a launch's guardian when the kernel cannot.

A kernel that holds a CUDA context or a process group cannot fork workers safely (see
:mod:`notebook_kit.launch.preflight`). Its template process (``python -m
notebook_kit.launch.template_process FD``, started by :mod:`notebook_kit.launch.template`)
is a new interpreter, never a fork of the kernel, so it holds neither, whatever the kernel
ran. It imports torch and the launch's modules once, then, per request on its socket to the
kernel, rebuilds the shipped call and forks the guardian with the forked launch's own code
(:func:`~notebook_kit.launch.forking.fork_workers`), and sends the kernel its ends of every
pipe. The guardian and the workers then run exactly as below a kernel.

It never outlives the kernel: the kernel's end of the socket closing, or its parent changing,
ends it, and each guardian it forked is told to stop (SIGHUP) as it goes; a guardian also
stops by itself when its control pipe (whose write end only the kernel holds) closes. It sits
in a session of its own, so the kernel's interrupts (a signal to the kernel's process group)
never reach it: the kernel forwards them to the workers as in a forked launch.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import traceback
from typing import Any

_CHECK_SECONDS = 0.5  # how often the parent is checked and finished guardians are reaped


def main(argv: list[str]) -> None:
    """Serve fork requests on the socket ``argv[1]`` until the kernel goes; ``argv[2]``,
    when there, is the niceness its imports run at (see :func:`_import_quietly`)."""
    sock = socket.socket(fileno=int(argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent, here = os.getppid(), os.getpid()

    def leave_the_kernels_line() -> None:
        # Only in the template's own children: a worker's fd of that number is something else.
        if os.getppid() == here:
            with contextlib.suppress(OSError):
                os.close(sock.fileno())

    os.register_at_fork(after_in_child=leave_the_kernels_line)
    _import_quietly(sock, parent, int(argv[2]) if len(argv) > 2 else 0)
    from notebook_kit.launch.template_wire import Ready, send

    try:
        send(sock, Ready(here))
        _serve(sock, parent)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the kernel went while this answered: nothing is left to serve


def _import_quietly(sock: socket.socket, parent: int, niceness: int) -> None:
    """Import torch and the launch's code, and start the warm-up imports, in a thread at
    ``niceness``: the template made at ``import notebook_kit`` asks for a low CPU priority, as
    nobody waits for it yet, the kernel (or a machine's other kernels) may be busy, and most
    kernels never use it; one a launch starts because it needs it now asks for none.

    Niceness is a thread's own on Linux, so this thread and the warm-up thread it starts are
    lowered, never the main thread, which forks every guardian: the workers run at the
    priority the kernel gave the template. Meanwhile the main thread watches the kernel: one
    that goes during the imports (seconds, at this priority) ends the template at once.
    """
    failed: list[BaseException] = []

    def imports() -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
        try:
            import torch.distributed  # noqa: F401 - paid once here, inherited by every worker

            from notebook_kit.launch import forking  # noqa: F401 - and the Accelerator's
            from notebook_kit.launch.warmup import start_warmup

            start_warmup()
        except BaseException as error:  # raised in the main thread: the template exits
            failed.append(error)

    thread = threading.Thread(target=imports, name="template-imports", daemon=True)
    thread.start()
    while thread.is_alive():
        # The kernel sends nothing before Ready: anything readable now is its end closing.
        ready, _, _ = select.select([sock], [], [], _CHECK_SECONDS / 2)
        if os.getppid() != parent or (ready and not sock.recv(1, socket.MSG_PEEK)):
            os._exit(0)  # nothing was forked yet: nothing to end but this process
    if failed:
        raise failed[0]


def _serve(sock: socket.socket, parent: int) -> None:
    from notebook_kit.launch.template_wire import receive, send

    guardians: set[int] = set()
    # A guardian that ended is reaped at once: the kernel waits until it is gone.
    wake, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    try:
        while os.getppid() == parent:
            ready, _, _ = select.select([sock, wake], [], [], _CHECK_SECONDS)
            with contextlib.suppress(BlockingIOError):
                os.read(wake, 4096)
            _reap(guardians)
            if sock not in ready:
                continue
            try:
                request, fds = receive(sock)
            except (EOFError, OSError):
                return  # the kernel is gone
            reply, ends = _fork_for(request, fds)
            try:
                send(sock, reply, ends)
            finally:
                for fd in ends:
                    os.close(fd)
            if reply.pid:
                guardians.add(reply.pid)
    finally:
        for pid in guardians:  # the kernel is gone: nothing of its launches may stay
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGHUP)


def _reap(guardians: set[int]) -> None:
    for pid in list(guardians):
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue
        guardians.discard(pid)


def _fork_for(request: Any, fds: list[int]) -> tuple[Any, list[int]]:
    """Fork the guardian for ``request``; the reply and the kernel's ends to send with it."""
    from notebook_kit.launch.forking import fork_workers, open_listener
    from notebook_kit.launch.template_shipping import unship
    from notebook_kit.launch.template_wire import ForkReply, SharedStopFlag
    from notebook_kit.launch.warmup import wait_for_warmup

    stop_flag = None
    workers: list[Any] = []
    try:
        _adopt(request)
        stop_flag = SharedStopFlag(fds[0])
        weights_fd = fds[1] if request.has_weights else None
        call, models = unship(request.payload, fds[2 if request.has_weights else 1 :])
        wait_for_warmup()
        with open_listener(request.plan) or contextlib.nullcontext() as listener:
            link = fork_workers(
                call,
                request.plan,
                listener,
                stop_flag,
                frozenset(id(model) for model in models),
                workers,
                request.restart_count,
                None,
                weights_fd,
            )
    except BaseException as error:  # told to the kernel, which raises it in the cell
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        _close_handles(workers)
        return ForkReply(error=text), []
    finally:
        if stop_flag is not None:
            stop_flag.close()  # the workers keep their own mapping of it
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    ends = [link.control_fd, link.status_fd]
    for worker in workers:
        ends += [worker.stdout.fd, worker.stderr.fd, worker.messages.fileno()]
        ends += [worker.answers.fileno()] if worker.answers is not None else []
    reply = ForkReply(
        pid=link.pid,
        ranks=tuple(worker.rank for worker in workers),
        answers=tuple(worker.answers is not None for worker in workers),
        model_ids=tuple(id(model) for model in models),
    )
    # The connections close their own descriptors: copies are sent, the originals closed.
    ends = [os.dup(fd) for fd in ends]
    _close_handles(workers)
    for fd in (link.control_fd, link.status_fd):
        os.close(fd)
    return reply, ends


def _close_handles(workers: list[Any]) -> None:
    """Close the template's copies of the kernel's ends of the workers' pipes."""
    for worker in workers:
        for fd in (worker.stdout.fd, worker.stderr.fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        worker.messages.close()
        if worker.answers is not None:
            worker.answers.close()


def _adopt(request: Any) -> None:
    """Take the kernel's environment, import path, arguments and folder: the call is rebuilt,
    and the workers run, as in the kernel."""
    os.environ.clear()
    os.environ.update(request.env)
    sys.path[:] = list(request.path)
    sys.argv[:] = list(request.argv)
    with contextlib.suppress(OSError):
        os.chdir(request.cwd)


if __name__ == "__main__":
    main(sys.argv)
