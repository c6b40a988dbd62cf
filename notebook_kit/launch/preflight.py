"""Checks made in the kernel before anything is forked, and the rendezvous socket.

Forking is only safe while the kernel holds no CUDA context and no process group. Both are
checked here, with messages that say what happened and how to recover.
"""

from __future__ import annotations

import errno
import socket

import torch
import torch.distributed as dist

from notebook_kit.config.environment import KernelState, _cuda_compiled, probe_kernel
from notebook_kit.errors import PortInUseError

__all__ = ["ForkSafetyError", "check_fork_safety", "open_rendezvous_socket"]


class ForkSafetyError(RuntimeError):
    """The kernel is in a state from which worker processes cannot be forked safely."""


def check_fork_safety(state: KernelState | None = None) -> KernelState:
    """Raise ForkSafetyError if workers cannot be forked from this process.

    ``state`` is an earlier probe's answer, when the launch already has one.
    """
    if dist.is_available() and dist.is_initialized():
        raise ForkSafetyError(
            "A torch.distributed process group is already initialised in this kernel, so "
            "forked workers would inherit it. Call torch.distributed.destroy_process_group() "
            "in the kernel (or restart the kernel), then launch again."
        )
    state = state or probe_kernel()
    if state.cuda_bad_fork or (_cuda_compiled() and torch.cuda.is_initialized()):
        raise ForkSafetyError(
            "CUDA is already initialised in this kernel, so forked workers cannot use the GPU. "
            "Something ran CUDA code before the launch (a .cuda() or .to('cuda') call, or a "
            "library doing so on import). Restart the kernel and keep all CUDA work inside the "
            "launched function."
        )
    return state


def open_rendezvous_socket(host: str, port: int | None) -> socket.socket:
    """Bind and listen on the rendezvous port before forking.

    Rank 0 serves the store on this very socket, so a free port can never be taken by someone
    else between choosing and using it, and a busy explicit port fails before any fork.
    """
    try:
        return socket.create_server((host, port or 0), backlog=1024)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise PortInUseError(
                errno.EADDRINUSE,
                f"Port {port} on {host} is already in use (by an earlier run that is still "
                f"alive, or by another job). Leave use_port unset to pick a free port, or "
                f"choose another one.",
            ) from error
        raise
