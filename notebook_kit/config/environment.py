"""What this machine and this kernel offer a launch, without changing either.

:func:`environment` gathers the facts once into an :class:`EnvironmentReport`; the report renders
itself as HTML in a notebook and as text everywhere else (``notebook-kit env``).

Nothing here initialises CUDA in the calling process: a kernel that touched CUDA can no longer
fork workers that use it. GPUs are counted through NVML when torch can, otherwise in a short-lived
forked child, whose CUDA state dies with it. torch is imported by the functions that use it, so
importing this module (as ``import notebook_kit`` does) stays cheap.
"""

from __future__ import annotations

import html
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from notebook_kit.config import forked_probe
from notebook_kit.config.forked_probe import describe_gpus_here as _describe_gpus_here
from notebook_kit.config.forked_probe import nvml_count as _nvml_count
from notebook_kit.config.forked_probe import run_in_fork as _run_in_fork
from notebook_kit.config.launch_config import (
    CONFIG_ENV_VAR,
    LaunchConfig,
    default_config_path,
    read_saved_default,
)
from notebook_kit.config.mesh_layout import MESH_ORDER, MeshLayout
from notebook_kit.config.schema import SETTINGS, settings_from_environ

__all__ = [
    "EnvironmentReport",
    "GpuInfo",
    "KernelState",
    "environment",
    "gpu_count",
    "probe_kernel",
    "usable_cpu_count",
]


@dataclass(frozen=True)
class GpuInfo:
    """One visible GPU."""

    index: int
    name: str
    memory_bytes: int


def _cuda_compiled() -> bool:
    import torch

    return bool(torch.cuda._is_compiled())


@dataclass(frozen=True)
class KernelState:
    """What the fork probe found out about the kernel, as a forked worker would see it.

    Attributes:
        cuda_bad_fork: A CUDA context exists in the kernel (made by torch or any other
            library), so a forked child cannot use the GPU.
        cuda_devices: GPUs a forked child can use (0 when ``cuda_bad_fork``).
        gpu_names: Their names, for the launch banner.
        probe_error: Why the probe could not tell (it failed or hung), else None.
        gpu_error: Why a forked child could not use the GPUs (the driver refused to start),
            else None: the run goes to the CPU and the banner says why.
    """

    cuda_bad_fork: bool
    cuda_devices: int
    gpu_names: tuple[str, ...] = ()
    probe_error: str | None = None
    gpu_error: str | None = None


def _driver_init_status() -> int | None:
    """``cuInit(0)`` through the driver library itself, or None where there is no driver.

    In a child forked from a process that created a CUDA context (through torch, cupy,
    numba, jax or a bare ``cuInit``), the driver refuses with CUDA_ERROR_NOT_INITIALIZED;
    torch's own bad-fork flag only knows about contexts torch made.
    """
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return int(driver.cuInit(0))


def _cuda_state_in_child() -> list[Any]:
    """[bad fork, device count, names, driver error] as seen from a freshly forked process."""
    import torch

    status = _driver_init_status()
    torch_bad_fork = getattr(torch._C, "_cuda_isInBadFork", lambda: False)  # CUDA builds only
    bad = bool(torch_bad_fork()) or status == forked_probe.CUDA_ERROR_NOT_INITIALIZED
    if bad or status not in (None, forked_probe.CUDA_SUCCESS):
        return [1 if bad else 0, 0, [], forked_probe.driver_error(status)]
    count = torch.cuda.device_count()
    return [0, count, [torch.cuda.get_device_name(index) for index in range(count)], None]


def _driver_loaded_here() -> bool:
    """True when this process has the CUDA driver library mapped.

    Every CUDA context, whoever makes it, lives in ``libcuda``; a process that never loaded it
    holds none, so it is safe to fork without asking a forked child.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any("libcuda.so" in line for line in maps)
    except OSError:  # not Linux: assume the worst and let the forked probe answer
        return True


_gpus_seen: dict[str | None, tuple[int, tuple[str, ...]]] = {}


def probe_kernel() -> KernelState:
    """Report CUDA's state as a forked worker would see it, without touching CUDA here.

    ``torch.cuda.is_initialized()`` misses a CUDA context created behind torch's back (by
    another library, or by ``torch.cuda.is_available()`` without NVML); the driver's answer
    in a forked child does not. While the driver library is not even loaded here, no context
    can exist and the GPUs found by an earlier probe (for the same ``CUDA_VISIBLE_DEVICES``)
    are reused, so a launch forks no probe at all.

    Example:
        >>> probe_kernel().cuda_bad_fork  # a kernel that ran no CUDA code
        False
    """
    if not _cuda_compiled():
        return KernelState(cuda_bad_fork=False, cuda_devices=0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible in _gpus_seen and not _driver_loaded_here():
        count, names = _gpus_seen[visible]
        return KernelState(False, count, names)
    try:
        bad, count, names, gpu_error = _run_in_fork(_cuda_state_in_child)
    except RuntimeError as error:
        return KernelState(cuda_bad_fork=False, cuda_devices=0, probe_error=str(error))
    if not bad and gpu_error is None:
        _gpus_seen[visible] = (int(count), tuple(names))
    return KernelState(bool(bad), int(count), tuple(names), gpu_error=gpu_error)


def gpu_count() -> int:
    """Number of visible GPUs, found without initialising CUDA in this process.

    Example:
        >>> gpu_count() >= 0
        True
    """
    import torch

    if not _cuda_compiled():
        return 0
    if torch.cuda.is_initialized():
        return torch.cuda.device_count()
    count = _nvml_count()
    if count >= 0:
        return count
    try:
        return int(_run_in_fork(torch.cuda.device_count))
    except RuntimeError:
        return 0


def _detect_gpus() -> tuple[tuple[GpuInfo, ...], str | None]:
    """Visible GPUs and, when there are none or they cannot be listed, why."""
    import torch

    if not _cuda_compiled():
        return (), f"torch {torch.__version__} was built without CUDA"
    try:
        rows = _describe_gpus_here() if torch.cuda.is_initialized() else None
        if rows is None:
            rows = _run_in_fork(_describe_gpus_here) if gpu_count() > 0 else []
    except RuntimeError as error:
        return (), f"could not list GPUs: {error}"
    gpus = tuple(GpuInfo(int(i), str(name), int(memory)) for i, name, memory in rows)
    return gpus, None if gpus else "no GPU visible (check CUDA_VISIBLE_DEVICES and the driver)"


def usable_cpu_count() -> int:
    """CPU cores this process may run on (its affinity mask, not the whole machine).

    Example:
        >>> usable_cpu_count() >= 1
        True
    """
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _distributed_backends() -> tuple[str, ...]:
    import torch

    distributed = torch.distributed
    if not distributed.is_available():
        return ()
    names = ("gloo", "nccl", "mpi", "ucc", "xccl")
    return tuple(name for name in names if getattr(distributed, f"is_{name}_available", bool)())


@dataclass(frozen=True, repr=False)
class EnvironmentReport:
    """Facts about the machine, the kernel and the saved config; see :func:`environment`."""

    python_version: str
    platform: str
    torch_version: str
    cpu_count: int
    machine_cpu_count: int
    gpus: tuple[GpuInfo, ...]
    gpu_note: str | None
    backends: tuple[str, ...]
    cuda_initialized: bool
    process_group_active: bool
    config_path: Path
    config_from_env: bool
    saved_config: LaunchConfig | None
    config_error: str | None
    # What the launch's own fork probe found: a CUDA context that torch did not make (cupy,
    # a bare cuInit), or why the probe could not tell. The launch refuses to fork on either.
    cuda_context_elsewhere: bool = False
    fork_probe_error: str | None = None
    # Settings given as NOTEBOOK_KIT_<NAME> variables (they win over the saved config).
    environment_settings: Mapping[str, Any] = field(default_factory=dict)
    environment_error: str | None = None

    @property
    def fork_safe(self) -> bool:
        """True when forked workers can still start CUDA and their own process group.

        The same answer as the launch's: it is the same probe.
        """
        return not (
            self.cuda_initialized
            or self.cuda_context_elsewhere
            or self.fork_probe_error
            or self.process_group_active
        )

    def _rows(self) -> list[tuple[str, list[str]]]:
        """(label, lines) pairs shared by the text and HTML renderings."""
        gpus = [f"{gpu.index}: {gpu.name}, {gpu.memory_bytes / 2**30:.1f} GiB" for gpu in self.gpus]
        fork = ["yes: CUDA is not initialised and no process group is active"]
        if self.cuda_initialized or self.cuda_context_elsewhere:
            made_by = "" if self.cuda_initialized else " (by a library other than torch)"
            fork = [
                f"NO: CUDA is initialised in this process{made_by}, so forked workers cannot "
                "use it.",
                "Restart the kernel and keep CUDA calls inside the training function.",
            ]
        elif self.fork_probe_error:
            fork = [f"NO: could not check ({self.fork_probe_error}); restart the kernel."]
        if self.process_group_active:
            cuda_problem = self.cuda_initialized or self.cuda_context_elsewhere
            kept = fork if cuda_problem or self.fork_probe_error else []
            fork = [*kept, "NO: a process group is active."]
            fork.append("Call torch.distributed.destroy_process_group() or restart the kernel.")
        where = f"${CONFIG_ENV_VAR}" if self.config_from_env else "user config directory"
        config = [f"{self.config_path} (from {where})"]
        if self.config_error:
            config.append(f"unreadable: {self.config_error}")
        elif self.saved_config is None:
            config.append("none saved; built-in defaults apply (`notebook-kit config` writes one)")
        else:
            config += [
                f"{name} = {'auto' if value is None else value}"
                for name, value in self.saved_config.to_dict().items()
            ]
        return [
            ("Python", [f"{self.python_version} on {self.platform}"]),
            ("torch", [self.torch_version]),
            ("CPU cores", [f"{self.cpu_count} usable of {self.machine_cpu_count}"]),
            ("GPUs", gpus or [f"none: {self.gpu_note}"]),
            ("Backends", [", ".join(self.backends) or "torch.distributed is unavailable"]),
            ("Fork-safe", fork),
            ("Saved config", config),
            ("Variables", self._variable_lines()),
            ("Mesh", self._mesh_lines()),
        ]

    def _mesh_lines(self) -> list[str]:
        """The ParallelismConfig a launch with these settings gives every Accelerator."""
        sizes = {}
        for dim in MESH_ORDER:
            name = f"parallelism_config_{dim}_size"
            saved = getattr(self.saved_config, name, 1) if self.saved_config else 1
            sizes[dim] = self.environment_settings.get(name, saved)
        layout = MeshLayout.of(sizes)
        if not layout.names:
            return ["none: every parallelism_config_* size is 1 (DDP, or FSDP with fsdp)"]
        return [layout.describe(), f"needs a world size of {layout.world_size}"]

    def _variable_lines(self) -> list[str]:
        """The NOTEBOOK_KIT_<NAME> settings in force, as they are written in the shell."""
        if self.environment_error:
            return [f"unreadable: {self.environment_error}"]
        lines = [
            f"{SETTINGS[name].env_var}={value} (over the saved config)"
            for name, value in self.environment_settings.items()
        ]
        return lines or ["no NOTEBOOK_KIT_<SETTING> variable is set"]

    def to_text(self) -> str:
        """The report as aligned plain text."""
        lines = ["notebook_kit environment"]
        for label, values in self._rows():
            for index, value in enumerate(values):
                lines.append(f"  {label if index == 0 else '':<14}{value}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "python_version": self.python_version,
            "platform": self.platform,
            "torch_version": self.torch_version,
            "cpu_count": self.cpu_count,
            "machine_cpu_count": self.machine_cpu_count,
            "gpus": [vars(gpu) for gpu in self.gpus],
            "gpu_note": self.gpu_note,
            "backends": list(self.backends),
            "cuda_initialized": self.cuda_initialized,
            "process_group_active": self.process_group_active,
            "fork_safe": self.fork_safe,
            "cuda_context_elsewhere": self.cuda_context_elsewhere,
            "fork_probe_error": self.fork_probe_error,
            "config_path": str(self.config_path),
            "saved_config": None if self.saved_config is None else self.saved_config.to_dict(),
            "config_error": self.config_error,
            "environment_settings": dict(self.environment_settings),
            "environment_error": self.environment_error,
        }

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        cells = []
        for label, values in self._rows():
            body = "<br>".join(html.escape(value) for value in values)
            if label == "Fork-safe" and not self.fork_safe:
                body = f'<span style="color:#b00020">{body}</span>'
            cells.append(
                f'<tr><th style="text-align:left;vertical-align:top">{label}</th>'
                f'<td style="text-align:left">{body}</td></tr>'
            )
        return (
            '<table class="nk-environment"><caption style="text-align:left">'
            f"<b>notebook_kit environment</b></caption>{''.join(cells)}</table>"
        )


def environment() -> EnvironmentReport:
    """Report torch, CPUs, GPUs, backends, fork-safety and the saved config.

    In a notebook the returned report displays as a table; print it for text.

    Example:
        >>> report = environment()
        >>> report.fork_safe
        True
    """
    import torch

    gpus, gpu_note = _detect_gpus()
    kernel = probe_kernel()  # what the launch asks: the report agrees with it
    saved, problem = read_saved_default()
    try:
        from_environ, environ_problem = settings_from_environ(os.environ), None
    except ValueError as error:
        from_environ, environ_problem = {}, str(error)
    distributed = torch.distributed
    return EnvironmentReport(
        python_version=platform.python_version(),
        platform=platform.platform(terse=True),
        torch_version=str(torch.__version__),
        cpu_count=usable_cpu_count(),
        machine_cpu_count=os.cpu_count() or 1,
        gpus=gpus,
        gpu_note=kernel.gpu_error if kernel.gpu_error and not gpus else gpu_note,
        backends=_distributed_backends(),
        cuda_initialized=bool(torch.cuda.is_initialized()),
        process_group_active=distributed.is_available() and distributed.is_initialized(),
        config_path=default_config_path(),
        config_from_env=bool(os.environ.get(CONFIG_ENV_VAR)),
        saved_config=saved,
        config_error=None if problem is None else str(problem),
        cuda_context_elsewhere=kernel.cuda_bad_fork and not torch.cuda.is_initialized(),
        fork_probe_error=kernel.probe_error,
        environment_settings=from_environ,
        environment_error=environ_problem,
    )
