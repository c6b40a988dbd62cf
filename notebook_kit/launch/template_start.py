"""The kernel's clean template process, started at ``import notebook_kit``: before the user's code.

Runs in the kernel, at import, so it imports nothing heavy (no torch): a socket pair and one
``Popen`` of a fresh interpreter (:mod:`notebook_kit.launch.template_process`), about a
millisecond; the template then imports torch and the launch's code by itself, in the
background, at a low CPU priority (one a launch starts because it needs it now: at the
kernel's). :mod:`notebook_kit.launch.template` adopts it at the first
launch that needs it, so that launch finds it ready instead of waiting seconds for it.

Only an IPython kernel's own process starts one at import: a launch from a kernel is what may
need it, after the notebook's code has made a CUDA context or a process group. Never a forked
worker or a process forked from the kernel (not the kernel's own pid), the template itself,
a cluster's node process, the ``notebook-kit`` command or a plain script (no kernel there: a
script that needs it pays the start at its first such launch, as before). Nor when the start
method is ``"fork"`` (the opt-out: the setting, from ``NOTEBOOK_KIT_START_METHOD`` or the
saved default), which never uses it.

Why a fresh interpreter, not a fork of the kernel at import: a fork would be clean only if
nothing before ``import notebook_kit`` made a CUDA context, and it would hold copies of the
kernel's descriptors (its ZMQ ports, which a restarted kernel binds again) and the locks of its
threads; it saves CPU only where torch was imported before notebook_kit (docs/guarantees.md
has the figures).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a template is started: a plain script's import stays light
    import socket
    import subprocess

__all__ = ["early_template_pid", "spawn_template", "start_at_import", "take_early_template"]

_MAIN = "notebook_kit.launch.template_process"
# Nobody waits for the one made at import: its imports take about a tenth of a busy CPU's share.
_AT_IMPORT_NICENESS = 10
_early: tuple[subprocess.Popen[bytes], socket.socket] | None = None


def spawn_template(niceness: int = 0) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Start a template process whose imports run at ``niceness``; its handle and the kernel's
    end of the socket to it.

    Example::

        process, sock = spawn_template()  # a Ready message arrives on sock once it imported
    """
    import socket
    import subprocess

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", _MAIN, str(theirs.fileno()), str(niceness)],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # the kernel's interrupts are not the template's
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, ours


def take_early_template() -> tuple[subprocess.Popen[bytes], socket.socket] | None:
    """The template started at import, handed over once (None: none was, or it is taken).

    Example::

        process, sock = take_early_template() or spawn_template()
    """
    global _early
    early, _early = _early, None
    return early


def early_template_pid() -> int | None:
    """The pid of the template started at import while it waits to be adopted, else None.

    Example::

        early_template_pid()  # None outside a kernel
    """
    return _early[0].pid if _early is not None and _early[0].poll() is None else None


def start_at_import(start_method: Callable[[], str]) -> bool:
    """Start the template now if this is a kernel's own process and ``start_method()`` (this
    process's, :func:`~notebook_kit.launch.template_choice.get_start_method`) may use it;
    whether one was started.

    Example::

        start_at_import(get_start_method)  # in notebook_kit/__init__.py
    """
    global _early
    if _early is not None or not _in_a_kernels_own_process():
        return False
    try:
        if start_method() == "fork":
            return False
    except ValueError:
        return False  # a bad NOTEBOOK_KIT_START_METHOD: the launch names it, not the import
    _early = spawn_template(_AT_IMPORT_NICENESS)
    return True


@atexit.register
def _end_early_template() -> None:
    """At the kernel's exit, end the template made at import that no launch adopted (an
    adopted one is ended by :func:`~notebook_kit.launch.template.end_template`): its end of
    the socket closing ends it, and the kernel reaps it rather than leave that to others."""
    early = take_early_template()
    if early is None:
        return
    import subprocess

    process, sock = early
    sock.close()
    try:
        process.wait(2.0)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _in_a_kernels_own_process() -> bool:
    """An IPython kernel runs in this very process (not in a parent this one was forked from).

    ipykernel's IOPub thread remembers the pid that made it: a fork of the kernel has a copy
    of the kernel's app, but another pid.
    """
    kernelapp = sys.modules.get("ipykernel.kernelapp")
    if kernelapp is None or not kernelapp.IPKernelApp.initialized():
        return False
    iopub = getattr(kernelapp.IPKernelApp.instance(), "iopub_thread", None)
    return getattr(iopub, "_master_pid", None) == os.getpid()
