"""The resolved shape of a launch: validated arguments plus defaults taken from the hardware."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from notebook_kit.config import arguments
from notebook_kit.config.cluster import DEFAULT_MASTER_PORT
from notebook_kit.config.environment import usable_cpu_count
from notebook_kit.config.launch_config import LaunchConfig
from notebook_kit.launch.preflight import KernelState, probe_kernel

__all__ = ["DEFAULT_RENDEZVOUS_TIMEOUT", "LOOPBACK", "Call", "LaunchPlan", "make_plan"]

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]  # function, args, kwargs

LOOPBACK = "127.0.0.1"
DEFAULT_RENDEZVOUS_TIMEOUT = 300.0  # seconds for the other nodes to join


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
    mixed_precision: str
    gradient_accumulation_steps: int
    rendezvous_timeout: float
    timeout: float | None
    max_restarts: int = 0
    seed: int | None = None
    live: bool | None = None
    kernel: KernelState | None = field(default=None, compare=False)  # the fork probe, if run

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
) -> LaunchPlan:
    """Resolve what ``config`` leaves to the machine (processes, backend, threads, port)."""
    rendezvous_timeout = (
        arguments.check_timeout(rendezvous_timeout, "rendezvous_timeout")
        or DEFAULT_RENDEZVOUS_TIMEOUT
    )
    timeout = arguments.check_timeout(timeout, "timeout")
    num_processes, backend = config.num_processes, config.backend
    kernel = probe_kernel() if num_processes is None or backend != "gloo" else None
    gpus = kernel.cuda_devices if kernel is not None else 0
    num_processes = num_processes or max(gpus, 1)
    backend = _choose_backend(backend, gpus, num_processes)
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
        kernel=kernel,
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
