"""``accelerator.state``: this process's place in the job, with Accelerate's names.

``PartialState()`` and ``AcceleratorState()`` can be built anywhere a training function runs and
describe the same process as the Accelerator does; unlike Accelerate's, they are plain objects
(no process-wide singleton), so building one never changes another and there is nothing to
reset. ``distributed_type`` says which kind of job this is, as Accelerate's ``DistributedType``.
"""

from __future__ import annotations

import builtins
import contextlib
import enum
import functools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from notebook_kit.accelerator import operations
from notebook_kit.accelerator.state import ProcessState, resolve_process_state, resolve_setting
from notebook_kit.runtime.context import current_launch

__all__ = ["AcceleratorState", "DistributedType", "PartialState", "split_inputs"]

F = TypeVar("F", bound=Callable[..., Any])


class DistributedType(str, enum.Enum):  # noqa: UP042 (str() as Accelerate's)
    """The kind of job a process belongs to (Accelerate's members and values).

    notebook_kit runs ``NO`` (one process), ``MULTI_CPU`` and ``MULTI_GPU``; the other members
    exist so that code branching on them keeps working.

    Example::

        if accelerator.distributed_type == DistributedType.MULTI_GPU:
            torch.backends.cudnn.benchmark = True
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


def _distributed_type(process: ProcessState) -> DistributedType:
    if process.num_processes == 1:
        kind = DistributedType.NO
    else:
        cuda = process.device.type == "cuda"
        kind = DistributedType.MULTI_GPU if cuda else DistributedType.MULTI_CPU
    return as_accelerates(kind)


def as_accelerates(kind: DistributedType) -> DistributedType:
    """Accelerate's member of the same name where the program imported Accelerate, so that
    ``is``, ``isinstance`` and ``match`` against ``accelerate.DistributedType`` hold as well as
    ``==`` (both are ``str`` enums of the same values). Never imports Accelerate itself."""
    theirs = getattr(sys.modules.get("accelerate.utils.dataclasses"), "DistributedType", None)
    if isinstance(theirs, type) and issubclass(theirs, enum.Enum):
        with contextlib.suppress(ValueError):
            return theirs(kind.value)  # type: ignore[return-value]
    return kind


def split_inputs(inputs: Any, rank: int, size: int, apply_padding: bool) -> Any:
    """This process's contiguous share of ``inputs`` (earlier ranks take the extras)."""
    if isinstance(inputs, Mapping):
        return {
            key: split_inputs(value, rank, size, apply_padding) for key, value in inputs.items()
        }
    per_process, extras = divmod(len(inputs), size)
    start = rank * per_process + min(rank, extras)
    share = inputs[start : start + per_process + (rank < extras)]
    if apply_padding and extras and rank >= extras and len(inputs):
        # Pad with the last item so every process gets the same count (then gather works).
        last = inputs[-1:]
        share = torch.cat([share, last]) if isinstance(share, torch.Tensor) else share + last
    return share


def _only_if(condition: Callable[[], bool], function: F) -> F:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs) if condition() else None

    return wrapper  # type: ignore[return-value]


class PartialState:
    """Rank, world size, device and kind of job of this process, plus its process helpers.

    Args:
        cpu: Stay on the CPU even when CUDA is available.

    Attributes:
        process_index, local_process_index, num_processes, device: As on the Accelerator.
        distributed_type: A :class:`DistributedType`.
        backend: The process group's backend (``"gloo"``, ``"nccl"``), None on one process.

    Example::

        state = PartialState()
        state.print(f"{state.num_processes} processes on {state.device}")
    """

    def __init__(self, cpu: bool = False, **_: Any) -> None:
        self._adopt(resolve_process_state(cpu))

    @classmethod
    def _from_process(cls, process: ProcessState, **extra: Any) -> PartialState:
        state = cls.__new__(cls)
        state._adopt(process)
        vars(state).update(extra)
        return state

    def _adopt(self, process: ProcessState) -> None:
        self.process_index = process.process_index
        self.local_process_index = process.local_process_index
        self.num_processes = process.num_processes
        self.device = process.device
        self.distributed_type = _distributed_type(process)
        initialised = dist.is_available() and dist.is_initialized()
        self.backend: str | None = str(dist.get_backend()) if initialised else None

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """No-op: ported test suites call this to clear Accelerate's shared state; each
        notebook_kit state object is independent, so there is nothing to clear."""

    # -- where this process stands ----------------------------------------------------------

    @property
    def initialized(self) -> bool:
        return True

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def debug(self) -> bool:
        """Collectives check shapes across processes first (``ACCELERATE_DEBUG_MODE``)."""
        return operations.debug_mode()

    @debug.setter
    def debug(self, enabled: bool) -> None:
        operations.set_debug_mode(bool(enabled))

    # -- synchronisation --------------------------------------------------------------------

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this line (no-op on one process)."""
        if self.num_processes > 1:
            dist.barrier()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on the others."""
        with self._first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Like ``main_process_first`` but per node."""
        with self._first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _first(self, leader: bool) -> Iterator[None]:
        if not leader:
            self.wait_for_everyone()
        yield
        if leader:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def split_between_processes(
        self, inputs: Sequence[Any] | Mapping[str, Any] | torch.Tensor, apply_padding: bool = False
    ) -> Iterator[Any]:
        """Give each process a contiguous share of a list, tensor or dict of them."""
        yield split_inputs(inputs, self.process_index, self.num_processes, apply_padding)

    # -- running on some processes only -----------------------------------------------------

    def on_main_process(self, function: F) -> F:
        """Decorator: run ``function`` only on the main process (None elsewhere)."""
        return _only_if(lambda: self.is_main_process, function)

    def on_local_main_process(self, function: F) -> F:
        """Decorator: run ``function`` only on each node's main process."""
        return _only_if(lambda: self.is_local_main_process, function)

    def on_last_process(self, function: F) -> F:
        """Decorator: run ``function`` only on the last process."""
        return _only_if(lambda: self.is_last_process, function)

    def on_process(self, function: F | None = None, process_index: int = 0) -> Any:
        """Decorator: run ``function`` only on ``process_index``."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return _only_if(lambda: self.process_index == process_index, function)

    def on_local_process(self, function: F | None = None, local_process_index: int = 0) -> Any:
        """Decorator: run ``function`` only on ``local_process_index`` of each node."""
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return _only_if(lambda: self.local_process_index == local_process_index, function)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """Accepted for Accelerate compatibility: the process group belongs to whoever made it
        (the launcher tears its own down when the function returns), so nothing happens here."""

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type.value}"
            f"{f'  Backend: {self.backend}' if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )


class AcceleratorState(PartialState):
    """:class:`PartialState` plus the precision setting (``accelerator.state`` is one).

    Built directly, ``mixed_precision`` comes from the launch, else the environment, as for
    the Accelerator.

    Example:
        >>> state = AcceleratorState()
        >>> state.mixed_precision
        'no'
    """

    def __init__(self, mixed_precision: str | None = None, cpu: bool = False, **_: Any) -> None:
        super().__init__(cpu)
        launch = current_launch()
        self.mixed_precision = resolve_setting(
            "mixed_precision", mixed_precision, launch and launch.mixed_precision
        )

    def __repr__(self) -> str:
        return super().__repr__() + f"Mixed precision type: {self.mixed_precision}\n"
