"""Resolving a launch: validated arguments plus defaults from the hardware, as a LaunchPlan."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from notebook_kit.config import arguments
from notebook_kit.config.cluster import DEFAULT_MASTER_PORT
from notebook_kit.config.environment import KernelState, probe_kernel, usable_cpu_count
from notebook_kit.config.launch_config import LaunchConfig
from notebook_kit.config.launch_plan import DEFAULT_RENDEZVOUS_TIMEOUT, LOOPBACK, LaunchPlan

__all__ = ["Call", "check_explicit_settings", "make_plan"]

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]  # function, args, kwargs

# The launcher's own spelling of each LaunchConfig field (Accelerate's names where it has one).
_LAUNCHER_NAMES = {"master_port": "use_port"}


def check_explicit_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the settings a caller passed (None = not given), keyed by LaunchConfig field.

    Errors name the argument as the caller spelled it (``use_port``, not ``master_port``).
    """
    given = {name: value for name, value in settings.items() if value is not None}
    checks: dict[str, Callable[[str, Any], Any]] = {
        "num_processes": lambda n, v: arguments.check_int(n, v, minimum=1),
        "num_nodes": lambda n, v: arguments.check_int(n, v, minimum=1),
        "node_rank": lambda n, v: arguments.check_int(n, v, minimum=0),
        "master_port": lambda n, v: arguments.check_int(n, v, minimum=1, maximum=65535),
        "threads_per_process": lambda n, v: arguments.check_int(n, v, minimum=1),
        "gradient_accumulation_steps": lambda n, v: arguments.check_int(n, v, minimum=1),
        "max_restarts": lambda n, v: arguments.check_int(n, v, minimum=0),
        "seed": lambda n, v: arguments.check_int(n, v, minimum=0),
        "mixed_precision": lambda n, v: arguments.check_choice(
            n, v, arguments.MIXED_PRECISION_CHOICES
        ),
        "backend": lambda n, v: arguments.check_choice(n, v, arguments.BACKEND_CHOICES),
        "master_addr": lambda n, v: arguments.check_master_addr(v),
    }
    checked = {
        name: checks[name](_LAUNCHER_NAMES.get(name, name), value) if name in checks else value
        for name, value in given.items()
    }
    if "num_nodes" in checked and "node_rank" in checked:
        arguments.check_node_rank(checked["num_nodes"], checked["node_rank"])
    return checked


def make_plan(
    config: LaunchConfig,
    *,
    timeout: Any = None,
    rendezvous_timeout: Any = DEFAULT_RENDEZVOUS_TIMEOUT,
    isolate: bool = False,
) -> LaunchPlan:
    """Resolve what ``config`` leaves to the machine (processes, backend, device, threads, port).

    Each process trains on its own GPU when there are enough of them (nccl between forked
    workers); otherwise on the CPU, and the banner says why.
    """
    rendezvous_timeout = (
        arguments.check_timeout(rendezvous_timeout, "rendezvous_timeout")
        or DEFAULT_RENDEZVOUS_TIMEOUT
    )
    timeout = arguments.check_timeout(timeout, "timeout")
    kernel = probe_kernel()
    num_processes = config.num_processes or max(kernel.cuda_devices, 1)
    in_kernel = num_processes == 1 and config.num_nodes == 1 and not isolate
    gpus = _gpus_for(kernel, in_kernel)
    backend = "gloo" if in_kernel else _choose_backend(config.backend, gpus, num_processes)
    device = "cuda" if gpus and (in_kernel or backend == "nccl") else "cpu"
    port = config.master_port
    if config.num_nodes > 1 and port is None:
        port = DEFAULT_MASTER_PORT
    return LaunchPlan(
        num_processes=num_processes,
        num_nodes=config.num_nodes,
        node_rank=config.node_rank,
        master_addr=config.master_addr if config.num_nodes > 1 else LOOPBACK,
        port=port,
        backend=backend,
        threads=config.threads_per_process or max(1, usable_cpu_count() // num_processes),
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        rendezvous_timeout=rendezvous_timeout,
        timeout=timeout,
        max_restarts=config.max_restarts,
        seed=config.seed,
        live=config.live,
        device=device,
        isolate=isolate,
        cpu_reason=_cpu_reason(gpus, num_processes, config.backend) if device == "cpu" else None,
        kernel=kernel,
    )


def _gpus_for(kernel: KernelState, in_kernel: bool) -> int:
    """GPUs the run can use: a forked worker sees the probe's count; the kernel its own.

    A kernel that already holds a CUDA context (an earlier run here on the GPU, or another
    library's) cannot fork workers onto the GPU, but can still train in itself: then torch's
    count is asked directly, which costs nothing more in a kernel CUDA already tainted.
    """
    if in_kernel and kernel.cuda_bad_fork:
        import torch

        return torch.cuda.device_count()
    return kernel.cuda_devices


def _cpu_reason(gpus: int, num_processes: int, backend: str | None) -> str | None:
    """Why a run with GPUs in sight stays on the CPU, for the banner (None: no GPU here)."""
    if not gpus:
        return None
    noun = "GPU" if gpus == 1 else "GPUs"
    if backend == "gloo":
        return f"backend='gloo': the workers run on CPU although {gpus} {noun} are visible"
    return (
        f"{num_processes} processes but {gpus} {noun} visible: the workers run on CPU (gloo); "
        f"use num_processes={gpus} to train on the {noun}"
    )


def _choose_backend(backend: str | None, gpus: int, num_processes: int) -> str:
    if backend is None:
        return "nccl" if gpus >= num_processes else "gloo"
    if backend == "nccl" and gpus < num_processes:
        raise ValueError(
            f"backend='nccl' needs one GPU per process, but {gpus} GPUs are visible for "
            f"num_processes={num_processes}. Use backend='gloo' or fewer processes."
        )
    return backend
