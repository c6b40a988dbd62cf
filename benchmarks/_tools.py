"""The launchers compared: each runs a ``Task`` on 2 CPU processes the way its users would.

Every tool's launched function only builds that tool's ``Backend`` and calls ``run_task``,
so the measured difference is the launcher and its training wrapper, nothing else.
Entry functions live at module level because spawn pickles them by name.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from benchmarks._harness import free_port
from benchmarks._workloads import Task, run_task

NUM_PROCESSES = 2


@dataclass(frozen=True)
class Tool:
    """One launcher under test."""

    name: str
    description: str
    launch: Callable[[Task], None]
    module: str  # the user's import; also tells whether the tool is installed
    names: tuple[str, ...] = ()  # what the import cell takes from it
    setup: Callable[[], None] | None = None  # the kernel's state before the launch cell

    def load(self) -> None:
        """The user's import cell: done before timing, as a notebook does it before launching."""
        module = importlib.import_module(self.module)
        for name in self.names:
            getattr(module, name)
        if self.setup is not None:
            self.setup()

    def unavailable(self) -> str | None:
        """Why this tool cannot run here, or None."""
        try:
            found = importlib.util.find_spec(self.module) is not None
        except ModuleNotFoundError:  # the parent package is missing
            found = False
        return None if found else f"{self.module} is not installed (pip install '.[bench]')"


def threads_per_worker() -> int:
    """Cores split between the workers: what a careful hand-written launcher sets."""
    return max(1, (os.cpu_count() or 1) // NUM_PROCESSES)


# -- notebook_kit ---------------------------------------------------------------------------


class _Silent:
    """A launch observer that shows nothing (the benchmark prints its own report)."""

    def on_start(self, info: Any) -> None: ...
    def on_output(self, rank: int, stream: Any, line: str) -> None: ...
    def on_metrics(self, batch: Any) -> None: ...
    def on_tick(self) -> None: ...
    def on_finish(self, summary: Any) -> None: ...


class _NotebookKitBackend:
    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._accelerator: Any = None

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        from notebook_kit import Accelerator

        self._accelerator = Accelerator()
        return self._accelerator.prepare(model, optimizer)

    def backward(self, loss: torch.Tensor) -> None:
        self._accelerator.backward(loss)


def _notebook_kit_entry(task: Task) -> None:
    run_task(task, _NotebookKitBackend())


def _launch_notebook_kit(task: Task) -> None:
    from notebook_kit import notebook_launcher

    notebook_launcher(
        _notebook_kit_entry, args=(task,), num_processes=NUM_PROCESSES, observer=_Silent()
    )


def _process_group_in_kernel() -> None:
    """What makes a kernel unsafe to fork: its workers start from the clean template."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


# -- raw torch: start_processes + init_process_group + DDP by hand --------------------------


class _TorchBackend:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.world_size = NUM_PROCESSES

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        return nn.parallel.DistributedDataParallel(model), optimizer

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()


def _torch_entry(rank: int, task: Task, port: int) -> None:
    torch.set_num_threads(threads_per_worker())
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=NUM_PROCESSES
    )
    run_task(task, _TorchBackend(rank))
    dist.destroy_process_group()


def _torch_launcher(start_method: str) -> Callable[[Task], None]:
    def launch(task: Task) -> None:
        import torch.multiprocessing as mp

        mp.start_processes(
            _torch_entry, args=(task, free_port()), nprocs=NUM_PROCESSES, start_method=start_method
        )

    return launch


# -- Hugging Face Accelerate ----------------------------------------------------------------


class _AccelerateBackend:
    def __init__(self, **options: Any) -> None:
        from accelerate import Accelerator

        self._accelerator = Accelerator(**options)  # this creates the process group
        self.rank = self._accelerator.process_index
        self.world_size = self._accelerator.num_processes

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        return self._accelerator.prepare(model, optimizer)

    def backward(self, loss: torch.Tensor) -> None:
        self._accelerator.backward(loss)


def _accelerate_entry(task: Task) -> None:
    # Without cpu=True each CPU worker runs alone (world size 1): see the report's notes.
    run_task(task, _AccelerateBackend(cpu=True))


def _accelerate_debug_entry(task: Task) -> None:
    run_task(task, _AccelerateBackend())


def _launch_accelerate(task: Task) -> None:
    from accelerate import notebook_launcher

    # A fresh port per run: the default 29500 may still be held by an earlier failed run.
    notebook_launcher(
        _accelerate_entry, args=(task,), num_processes=NUM_PROCESSES, use_port=str(free_port())
    )


def _launch_accelerate_debug(task: Task) -> None:
    from accelerate import debug_launcher

    debug_launcher(_accelerate_debug_entry, args=(task,), num_processes=NUM_PROCESSES)


# -- Lightning Fabric -----------------------------------------------------------------------


class _FabricBackend:
    def __init__(self, fabric: Any) -> None:
        self._fabric = fabric
        self.rank = fabric.global_rank
        self.world_size = fabric.world_size

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        return self._fabric.setup(model, optimizer)

    def backward(self, loss: torch.Tensor) -> None:
        self._fabric.backward(loss)


def _fabric_entry(fabric: Any, task: Task) -> None:
    run_task(task, _FabricBackend(fabric))


def _launch_fabric(task: Task) -> None:
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=NUM_PROCESSES, strategy="ddp_notebook")
    fabric.launch(_fabric_entry, task)


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            "notebook_kit",
            "notebook_launcher (fork)",
            _launch_notebook_kit,
            "notebook_kit",
            ("notebook_launcher",),
        ),
        Tool(
            "notebook_kit-template",
            "notebook_launcher from a kernel holding a process group (clean template)",
            _launch_notebook_kit,
            "notebook_kit",
            ("notebook_launcher",),
            _process_group_in_kernel,
        ),
        Tool(
            "torch-fork",
            "start_processes fork + gloo + DDP by hand",
            _torch_launcher("fork"),
            "torch.multiprocessing",
        ),
        Tool(
            "torch-spawn",
            "start_processes spawn + gloo + DDP by hand",
            _torch_launcher("spawn"),
            "torch.multiprocessing",
        ),
        Tool(
            "accelerate",
            "notebook_launcher + Accelerator(cpu=True)",
            _launch_accelerate,
            "accelerate",
        ),
        Tool(
            "accelerate-debug",
            "debug_launcher + Accelerator()",
            _launch_accelerate_debug,
            "accelerate",
        ),
        Tool(
            "fabric", "Fabric(strategy='ddp_notebook').launch", _launch_fabric, "lightning.fabric"
        ),
    )
}
