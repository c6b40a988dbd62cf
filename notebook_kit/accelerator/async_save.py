"""Asynchronous checkpoint saves: the state copied to host memory, then written by a thread.

``save_state(async_save=True)`` takes a copy of everything the checkpoint holds (every tensor
of the state dicts, on the CPU; the RNG states and data positions) and returns; a thread of
this process writes the copy and takes part in the commit (see
:mod:`~notebook_kit.accelerator.checkpointing`) while training goes on, so weights changed
after the call never reach the checkpoint. :class:`HostStaging` keeps the host buffers from one
save to the next (allocating and first touching the pages costs more than the copy itself).

:class:`BackgroundSaves` holds one Accelerator's pending save. It is waited for by the next
``save_state`` (the two never overlap, so at most one host copy exists), by ``load_state``,
``end_training``, the end of a launched function (it is one of the launch's
``extensions``, which the launch closes) and, outside any launch, at interpreter exit. An
error of the background write is raised at that wait, naming the checkpoint. The thread's
collectives go through a gloo process group of their own, created at the first asynchronous
save (every rank calls ``save_state``), never through the one training uses.
"""

from __future__ import annotations

import atexit
import copy
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from notebook_kit.accelerator.checkpoint_files import CheckpointSaveError, CheckpointSpaceError
from notebook_kit.accelerator.operations import world_size
from notebook_kit.accelerator.save_agreement import first_line
from notebook_kit.runtime.context import current_launch

__all__ = ["BackgroundSaves", "HostStaging", "SaveAbandoned"]


class SaveAbandoned(Exception):
    """The function ended with an error (or an interrupt) while its save was pending."""


class HostStaging:
    """CPU copies of nested state dicts, in buffers reused by the next copy of the same shapes.

    Tensors shared inside one copy (tied weights) stay shared; a DTensor becomes a DTensor
    with the same sharding over a copy of its local shard.

    Example::

        staging = HostStaging()
        saved = staging.copy({"model_0.pt": model.state_dict()})
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._used: dict[tuple[Any, ...], torch.Tensor] = {}

    def copy(self, state: Any) -> Any:
        """A copy of ``state`` that later changes of its tensors do not reach."""
        self._used = {}
        staged = self._copy(state, (), {})
        if any(buffer.is_pinned() for buffer in self._used.values()):
            torch.cuda.synchronize()  # the non-blocking copies from the GPU have landed
        self._buffers, self._used = self._used, {}  # buffers of vanished tensors are freed
        return staged

    def _copy(self, obj: Any, key: tuple[Any, ...], seen: dict[int, Any]) -> Any:
        if isinstance(obj, torch.Tensor):
            if id(obj) not in seen:
                seen[id(obj)] = self._tensor(obj, key)
            return seen[id(obj)]
        if isinstance(obj, Mapping):
            staged = type(obj)((k, self._copy(v, (*key, k), seen)) for k, v in obj.items())
            if hasattr(obj, "_metadata"):  # a module's state dict: versions load_state_dict reads
                staged._metadata = copy.deepcopy(obj._metadata)
            return staged
        if isinstance(obj, list | tuple):
            items = [self._copy(v, (*key, i), seen) for i, v in enumerate(obj)]
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        return copy.deepcopy(obj)

    def _tensor(self, tensor: torch.Tensor, key: tuple[Any, ...]) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if isinstance(tensor, DTensor):
            local = self._plain(tensor.to_local(), key)
            return DTensor(local, tensor._spec, requires_grad=False)  # no move to the mesh's device
        return self._plain(tensor, key)

    def _plain(self, tensor: torch.Tensor, key: tuple[Any, ...]) -> torch.Tensor:
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pinned = tensor.is_cuda
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)
        buffer.copy_(tensor.detach(), non_blocking=tensor.is_cuda)
        self._used[key] = buffer
        return buffer


class BackgroundSaves:
    """One Accelerator's asynchronous saves: at most one pending, its gloo group, its buffers.

    Example::

        saves = BackgroundSaves()
        saves.start(write, "checkpoint 3 (ckpt/checkpoint_3)")
        saves.wait()  # raises CheckpointSaveError if the write failed
    """

    def __init__(self) -> None:
        self.staging = HostStaging()
        self.abandoned = threading.Event()
        self._group: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._what = ""

    def __reduce__(self) -> tuple[Any, ...]:
        """A pickled Accelerator gets saves of its own: a pending write stays in this process."""
        return (BackgroundSaves, ())

    def process_group(self) -> Any:
        """The gloo group of the background collectives (None with one process); collective
        the first time, so every rank must call it at the same point."""
        if self._group is None and world_size() > 1:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def start(self, write: Callable[[], None], what: str) -> None:
        """Run ``write`` on a thread; ``what`` names the checkpoint in a failure's message."""
        self.wait()
        self.abandoned.clear()
        self._what = what
        self._thread = threading.Thread(
            target=self._run, args=(write,), name=f"save_state {what}", daemon=True
        )
        launch = current_launch()
        if launch is not None:  # the launch closes it when the function ends
            launch.extensions[f"{__name__}.{id(self)}"] = self
        else:  # a plain script: the write is not cut off by the interpreter's exit
            atexit.register(self.wait)
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as error:
            self._error = error

    @property
    def pending(self) -> bool:
        """Whether a save was started and not yet waited for."""
        return self._thread is not None

    def wait(self) -> None:
        """Return once the pending save (if any) is written and committed.

        Raises:
            CheckpointSpaceError: The disk filled up during the background write.
            CheckpointSaveError: Any other failure of the background write; the checkpoint
                was not saved and earlier ones are intact.
        """
        thread = self._thread
        if thread is None:
            return
        thread.join()
        self._thread = None
        atexit.unregister(self.wait)
        error, self._error = self._error, None
        if error is None or self.abandoned.is_set():
            return
        if isinstance(error, CheckpointSpaceError):
            message = f"The asynchronous save_state of {self._what} failed: {error}"
            raise CheckpointSpaceError(error.errno, message) from error
        raise CheckpointSaveError(
            f"The asynchronous save_state of {self._what} failed in the background "
            f"({type(error).__name__}: {first_line(error)}); that checkpoint "
            "was not saved and the checkpoints saved before it are intact. Fix the cause "
            "and call save_state() again."
        ) from error

    def close(self) -> None:
        """The end of a launched function: wait for the pending save, or, when the function
        is ending with an error or an interrupt, abandon it (it is never committed)."""
        if sys.exc_info()[1] is not None:
            self.abandoned.set()
            return
        self.wait()
