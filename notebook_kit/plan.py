"""The resolved shape of a launch: validated arguments plus defaults taken from the hardware."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from notebook_kit import arguments
from notebook_kit.preflight import probe_kernel

__all__ = ["DEFAULT_MULTI_NODE_PORT", "LOOPBACK", "Call", "LaunchPlan", "make_plan"]

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]  # function, args, kwargs

DEFAULT_MULTI_NODE_PORT = 29500
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LaunchPlan:
    """The validated, resolved shape of one launch on this node."""

    num_processes: int
    num_nodes: int
    node_rank: int
    master_addr: str
    port: int | None
    backend: str
    threads: int
    mixed_precision: str | None
    gradient_accumulation_steps: int | None
    rendezvous_timeout: float
    timeout: float | None
    max_restarts: int = 0

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_nodes

    @property
    def in_process(self) -> bool:
        """One process on one node runs in the caller, without forking."""
        return self.num_processes == 1 and self.num_nodes == 1

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.num_processes + local_rank

    def banner(self) -> str:
        if self.in_process:
            return "Running 1 process in this kernel (world size 1, gloo)"
        where = "CPU" if self.backend == "gloo" else f"{self.num_processes} GPUs"
        noun = "process" if self.num_processes == 1 else "processes"
        text = f"Launching {self.num_processes} {noun} on {where} ({self.backend})"
        if self.num_nodes > 1:
            text += f", node {self.node_rank} of {self.num_nodes}, world size {self.world_size}"
        threads = "thread" if self.threads == 1 else "threads"
        return f"{text}, {self.threads} {threads} each"


def make_plan(
    *,
    num_processes: Any = None,
    mixed_precision: Any = None,
    use_port: Any = None,
    master_addr: Any = LOOPBACK,
    node_rank: Any = 0,
    num_nodes: Any = 1,
    backend: Any = None,
    threads_per_process: Any = None,
    gradient_accumulation_steps: Any = None,
    rendezvous_timeout: Any = 300.0,
    timeout: Any = None,
    max_restarts: Any = 0,
) -> LaunchPlan:
    """Validate every argument and resolve the defaults (before anything is forked)."""
    num_nodes, node_rank = arguments.check_nodes(num_nodes, node_rank)
    num_processes = arguments.check_optional_int("num_processes", num_processes, minimum=1)
    mixed_precision = arguments.check_optional_choice(
        "mixed_precision", mixed_precision, arguments.MIXED_PRECISION_CHOICES
    )
    port = arguments.check_optional_int("use_port", use_port, minimum=1, maximum=65535)
    master_addr = arguments.check_master_addr(master_addr)
    backend = arguments.check_optional_choice("backend", backend, arguments.BACKEND_CHOICES)
    threads = arguments.check_optional_int("threads_per_process", threads_per_process, minimum=1)
    accumulation = arguments.check_optional_int(
        "gradient_accumulation_steps", gradient_accumulation_steps, minimum=1
    )
    rendezvous_timeout = arguments.check_timeout(rendezvous_timeout) or 300.0
    timeout = arguments.check_timeout(timeout)
    max_restarts = arguments.check_int("max_restarts", max_restarts, minimum=0)
    gpus = probe_kernel().cuda_devices if num_processes is None or backend != "gloo" else 0
    num_processes = num_processes or max(gpus, 1)
    backend = _choose_backend(backend, gpus, num_processes)
    if num_nodes > 1 and port is None:
        port = DEFAULT_MULTI_NODE_PORT
    return LaunchPlan(
        num_processes=num_processes,
        num_nodes=num_nodes,
        node_rank=node_rank,
        master_addr=master_addr if num_nodes > 1 else LOOPBACK,
        port=port,
        backend=backend,
        threads=threads or max(1, usable_cores() // num_processes),
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=accumulation,
        rendezvous_timeout=rendezvous_timeout,
        timeout=timeout,
        max_restarts=max_restarts,
    )


def _choose_backend(backend: str | None, gpus: int, num_processes: int) -> str:
    if backend is None:
        return "nccl" if num_processes > 1 and gpus >= num_processes else "gloo"
    if backend == "nccl" and gpus < num_processes:
        raise ValueError(
            f"backend='nccl' needs one GPU per process, but {gpus} GPUs are visible for "
            f"num_processes={num_processes}. Use backend='gloo' or fewer processes."
        )
    return backend


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
