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
from notebook_kit.launch.template_choice import get_start_method
from notebook_kit.runtime.context import current_launch

__all__ = [
    "ForkSafetyError",
    "check_fork_safety",
    "check_not_in_a_launch",
    "fork_hazard",
    "note_gpu_run_in_kernel",
    "open_rendezvous_socket",
    "start_route",
]


class ForkSafetyError(RuntimeError):
    """The kernel is in a state from which worker processes cannot be forked safely."""


_gpu_run_in_kernel = False  # a num_processes=1 launch trained on the GPU in this process


def note_gpu_run_in_kernel() -> None:
    """Remember that a launch ran on the GPU here, so a later fork refusal can say so."""
    global _gpu_run_in_kernel
    _gpu_run_in_kernel = True


def check_not_in_a_launch(caller: str = "notebook_launcher") -> None:
    """Refuse a launch from inside a forked worker, before anything is probed or forked.

    A worker holds its launch's process group (and maybe a GPU); a launch of its own would
    fork copies of it. The kernel's message ("this kernel") would point the wrong way. A
    worker is told apart by its line to the kernel: a run in the kernel itself has none.
    """
    context = current_launch()
    if context is None or context.send is None:
        return
    raise ForkSafetyError(
        f"{caller} was called inside a worker of a running launch (rank {context.rank} of "
        f"{context.world_size}), and a worker cannot start a launch of its own: its copies "
        "would inherit this launch's process group. Call the training code directly here, "
        f"and call {caller} from a notebook cell or the top level of a script."
    )


def check_fork_safety(state: KernelState | None = None) -> KernelState:
    """Raise ForkSafetyError if workers cannot be forked from this process.

    ``state`` is an earlier probe's answer, when the launch already has one.
    """
    check_not_in_a_launch()
    if dist.is_available() and dist.is_initialized():
        raise ForkSafetyError(
            "A torch.distributed process group is already initialised in this kernel, so "
            "forked workers would inherit it. Call torch.distributed.destroy_process_group() "
            "in the kernel (or restart the kernel), then launch again."
        )
    state = state or probe_kernel()
    if state.probe_error is not None:
        raise ForkSafetyError(
            f"Could not check that this kernel is safe to fork: {state.probe_error}. Forked "
            "workers would likely fail the same way. Restart the kernel and launch again."
        )
    torch_context = _cuda_compiled() and torch.cuda.is_initialized()
    if state.cuda_bad_fork or torch_context:
        raise ForkSafetyError(_cuda_refusal(torch_context))
    return state


def fork_hazard(state: KernelState | None = None) -> str | None:
    """Why workers cannot be forked from this process, as the launch's banner says it; None
    when they can. A launch then starts them from a clean process instead
    (:mod:`notebook_kit.launch.template`).

    Example:
        >>> fork_hazard() is None  # a kernel that made no process group and ran no CUDA code
        True
    """
    if dist.is_available() and dist.is_initialized():
        return "the kernel holds a torch.distributed process group"
    state = state or probe_kernel()
    if state.probe_error is not None:
        return f"the kernel could not be checked to be safe to fork ({state.probe_error})"
    if _cuda_compiled() and torch.cuda.is_initialized():
        return "the kernel holds a CUDA context (made by torch)"
    if state.cuda_bad_fork:
        return "the kernel holds a CUDA context (made by cupy, numba, jax or a driver call)"
    return None


def start_route(
    state: KernelState | None = None, caller: str = "WorkerPool", method: str | None = None
) -> str | None:
    """None when workers fork from this process; else why they start from its clean template
    (the words of the start line). The start method (``method``, a plan's ``start_method``;
    None: this process's, ``set_start_method``) decides:
    ``"auto"`` forks only a kernel safe to fork, ``"template"`` never forks, ``"fork"`` always
    does.

    Raises:
        ForkSafetyError: the start method is ``"fork"`` and the kernel is unsafe to fork.

    Example:
        >>> start_route() is None  # a kernel that made no process group and ran no CUDA code
        True
    """
    check_not_in_a_launch(caller)
    method = method or get_start_method()
    hazard = None if method == "fork" else fork_hazard(state)
    if method == "template" or hazard is not None:
        return hazard or "the start method is 'template'"
    try:
        check_fork_safety(state)
    except ForkSafetyError as error:
        raise ForkSafetyError(
            f"{error} (start_method is 'fork', from the keyword, config=, set_start_method() "
            "or NOTEBOOK_KIT_START_METHOD: with 'auto' the workers would start from a clean "
            "process instead.)"
        ) from None
    return None


def _cuda_refusal(torch_context: bool) -> str:
    """What made CUDA unusable for forked workers, and how to get them back."""
    if _gpu_run_in_kernel:
        cause = (
            "An earlier launch with num_processes=1 trained on the GPU in this kernel, which "
            "initialised CUDA here"
        )
    elif torch_context:
        cause = (
            "Something ran CUDA code through torch before the launch (a .cuda() or "
            ".to('cuda') call, or a library doing so on import)"
        )
    else:
        cause = (
            "A library other than torch created a CUDA context in this kernel (cupy, numba, "
            "jax or a direct driver call; also torch.cuda.is_available() when "
            "PYTORCH_NVML_BASED_CUDA_CHECK=0)"
        )
    return (
        f"{cause}, so forked workers cannot use CUDA. Restart the kernel and keep all CUDA "
        "work inside the launched function; to train one process on the GPU and still fork "
        "later, launch it with isolate=True."
    )


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
