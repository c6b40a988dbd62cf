"""Resolving a launch: validated arguments plus defaults from the hardware, as a LaunchPlan."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from notebook_kit.config import arguments
from notebook_kit.config.environment import KernelState, probe_kernel, usable_cpu_count
from notebook_kit.config.launch_config import LaunchConfig
from notebook_kit.config.launch_plan import (
    DEFAULT_RENDEZVOUS_TIMEOUT,
    DEFAULT_STALL_SECONDS,
    LOOPBACK,
    LaunchPlan,
    auto_process_count,
    auto_threads,
)
from notebook_kit.config.mesh_layout import MESH_ORDER, MeshLayout, check_mesh_fits
from notebook_kit.config.placement import DEFAULT_MASTER_PORT
from notebook_kit.config.process_limits import check_process_count
from notebook_kit.config.schema import SETTINGS, check_argument
from notebook_kit.launch.debugger_desk import can_type
from notebook_kit.launch.preflight import check_fork_safety

__all__ = [
    "Call",
    "check_explicit_settings",
    "check_memory_history",
    "collective_timeout",
    "make_plan",
    "parallelism_sizes",
]

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]  # function, args, kwargs
# Where a cell or terminal can answer pdb, a rank may sit at a breakpoint for as long as the
# user reads its locals while the others wait in a collective: torch's 30 minutes would end the
# run under them. The stall report names that rank and Stop ends the run; nothing else must.
DEBUGGING_COLLECTIVE_TIMEOUT = 7 * 24 * 3600.0


def collective_timeout() -> float | None:
    """The ranks' collective timeout for a run started here (None: torch's default)."""
    return DEBUGGING_COLLECTIVE_TIMEOUT if can_type() else None


_PLAN_FIELDS = tuple(field.name for field in dataclasses.fields(LaunchPlan))


def check_explicit_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the settings a caller passed (None = not given), keyed by LaunchConfig field.

    Ranges and choices come from the schema; errors name the argument as the caller spelled
    it (``use_port``, not ``master_port``).
    """
    checked = {
        name: check_argument(SETTINGS[name], value)
        for name, value in settings.items()
        if value is not None
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
    stall_seconds: Any = DEFAULT_STALL_SECONDS,
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
    stall_seconds = arguments.check_timeout(stall_seconds, "stall_seconds")
    if config.num_processes is not None:  # before the probe forks, or anything is opened
        check_process_count(config.num_processes)
    kernel = probe_kernel()
    num_processes = config.num_processes or auto_process_count(kernel.cuda_devices)
    in_kernel = num_processes == 1 and config.num_nodes == 1 and not isolate
    if in_kernel and config.use_fsdp:
        raise ValueError(
            "fsdp=True shards the model over the processes of a launch, but num_processes=1 "
            "runs in this kernel with nothing to shard over: use num_processes=2 (or more), or "
            "isolate=True to shard over one forked process."
        )
    gpus = _gpus_for(kernel, in_kernel or config.start_method != "fork")
    if not in_kernel and config.backend == "nccl" and gpus < num_processes:
        check_fork_safety(kernel)  # a tainted kernel sees no GPU: name that cause, not the count
    backend = "gloo" if in_kernel else _choose_backend(config.backend, gpus, num_processes)
    device = "cuda" if gpus and (in_kernel or backend == "nccl") else "cpu"
    parallelism_sizes(config, num_processes, device=device)
    cpu_reason = _cpu_reason(kernel, gpus, num_processes, config.backend)
    check_memory_history(config, device, cpu_reason)
    port = config.master_port
    if config.num_nodes > 1 and port is None:
        port = DEFAULT_MASTER_PORT
    decided = {
        "num_processes": num_processes,
        "master_addr": config.master_addr if config.num_nodes > 1 else LOOPBACK,
        "port": port,
        "backend": backend,
        "threads": config.threads_per_process or auto_threads(num_processes),
        "rendezvous_timeout": rendezvous_timeout,
        "timeout": timeout,
        "device": device,
        "isolate": isolate,
        "cpu_reason": cpu_reason if device == "cpu" else None,
        "kernel": kernel,
        "cores": usable_cpu_count(),
        "stall_seconds": stall_seconds,
        "collective_timeout": collective_timeout(),
    }
    # The other settings the plan has a field for go in as they are (mesh sizes checked above).
    as_given = {name: getattr(config, name) for name in _PLAN_FIELDS if name in SETTINGS}
    return LaunchPlan(**{**as_given, **decided})


def parallelism_sizes(
    config: LaunchConfig,
    num_processes: int,
    *,
    num_nodes: int | None = None,
    device: str | None = None,
) -> tuple[tuple[str, int], ...]:
    """The launch's ``parallelism_config_*`` sizes by mesh dimension, checked before any start.

    All 1 (the default) means none: ``()``. Otherwise Accelerate's rule that replicas alone
    are DDP, the world size and the nodes
    (:func:`~notebook_kit.config.mesh_layout.check_mesh_fits`, on ``num_nodes`` nodes,
    else ``config.num_nodes``), that sharding dimensions need ``fsdp=True``, and, when the
    ``device`` the ranks will train on is known, that context parallel needs ``"cuda"``.

    Example:
        >>> parallelism_sizes(LaunchConfig(), 2)
        ()
    """
    sizes = {name: getattr(config, f"parallelism_config_{name}_size") for name in MESH_ORDER}
    if all(size == 1 for size in sizes.values()):
        return ()
    _refuse_replicas_alone(sizes)
    check_mesh_fits(MeshLayout.of(sizes), num_processes, num_nodes or config.num_nodes)
    shards = sizes["dp_shard"] > 1 or sizes["cp"] > 1
    if shards and not config.use_fsdp:
        raise ValueError(
            f"parallelism_config_dp_shard_size={sizes['dp_shard']} and "
            f"parallelism_config_cp_size={sizes['cp']} shard the model with FSDP2, which this "
            "launch does not turn on: add fsdp=True (--use-fsdp), or set both to 1."
        )
    if sizes["cp"] > 1 and device is not None and device != "cuda":
        raise ValueError(
            f"parallelism_config_cp_size={sizes['cp']} needs CUDA GPUs, but this launch's "
            f"ranks run on the {device.upper()}: context parallel passes keys and values around "
            "a ring inside torch's flash/efficient attention kernels, which CPU processes do "
            "not have. Launch one process per GPU, or set parallelism_config_cp_size=1."
        )
    return tuple(sizes.items())


def check_memory_history(config: LaunchConfig, device: str, why: str | None = None) -> None:
    """Refuse ``memory_history=True`` for ranks that would train on the CPU (``why``: the
    reason, when GPUs are in sight), before anything starts: only a GPU's allocator has a
    history to record.

    Example:
        >>> check_memory_history(LaunchConfig(memory_history=True), "cuda")
    """
    if not config.memory_history or device == "cuda":
        return
    cause = f" ({why})" if why else " (no GPU is visible)"
    raise ValueError(
        f"memory_history=True needs CUDA GPUs, but this launch's ranks run on the CPU{cause}: "
        "it records the CUDA allocator's history, which CPU processes do not have. Launch "
        "one process per GPU, or leave memory_history out."
    )


def _refuse_replicas_alone(sizes: Mapping[str, int]) -> None:
    """Accelerate's rule, in the launch's words: replicas without shards are DDP."""
    if sizes["dp_replicate"] == 1 or sizes["dp_shard"] > 1:
        return
    others = [f"parallelism_config_{dim}_size" for dim in ("tp", "cp") if sizes[dim] > 1]
    what = (
        f" with {' and '.join(others)} (DDP composed with TP/CP, not supported)" if others else ""
    )
    raise ValueError(
        f"parallelism_config_dp_replicate_size={sizes['dp_replicate']} with "
        f"parallelism_config_dp_shard_size=1{what} is plain data parallel: leave "
        "parallelism_config_dp_replicate_size at 1 (every launch of several processes is DDP "
        "already), or add parallelism_config_dp_shard_size > 1 and fsdp=True for HSDP."
    )


def _gpus_for(kernel: KernelState, not_forked: bool) -> int:
    """GPUs the run can use: a forked worker sees the probe's count; the kernel (a run in it,
    ``not_forked``, or one its template starts) its own.

    A kernel that already holds a CUDA context (an earlier run here on the GPU, or another
    library's) cannot fork workers onto the GPU, but can still train in itself, and workers
    started from its clean template process can use every GPU: then torch's count is asked
    directly, which costs nothing more in a kernel CUDA already tainted.
    """
    if kernel.cuda_bad_fork and not_forked:
        import torch

        return torch.cuda.device_count()
    return kernel.cuda_devices


def _cpu_reason(
    kernel: KernelState, gpus: int, num_processes: int, backend: str | None
) -> str | None:
    """Why a run with GPUs in sight stays on the CPU, for the banner (None: no GPU here).

    A driver that failed to start, or a probe that could not tell, is said too: a run that
    silently trains on the CPU of a GPU machine looks like a very slow GPU run.
    """
    if not gpus:
        if kernel.gpu_error:
            return f"No GPU is used: {kernel.gpu_error}; the run is on CPU"
        if kernel.probe_error:
            problem = kernel.probe_error
            return f"No GPU is used: could not check for GPUs ({problem}); the run is on CPU"
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
