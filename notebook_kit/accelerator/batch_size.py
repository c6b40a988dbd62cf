"""``find_executable_batch_size``: Accelerate's decorator, with one size that every rank agrees on.

In one process it is Accelerate's: the decorated function gets the batch size as its first
argument, and an out-of-memory error (:func:`should_reduce_batch_size`) frees memory and
calls it again with a smaller size, until it runs or the size reaches zero.

Across the ranks of a launch that cannot work: the rank that ran out of memory would retry
alone while the others wait for it in a collective (DDP's all-reduce) and hang. Here that rank
ends with a :class:`~notebook_kit.runtime.batch_agreement.BatchSizeReduction` instead, the
launch (``launch/batch_sizes.py``) stops and restarts every rank, and the decorator reads the
size they agreed on when it starts. Where no launch can restart every rank (a ``WorkerPool``,
``%%distributed``, a cluster run, torchrun), several ranks are refused before the function runs.
"""

from __future__ import annotations

import functools
import gc
import inspect
import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from notebook_kit.runtime.batch_agreement import BatchSizeReduction, agreed_sizes
from notebook_kit.runtime.context import current_launch

__all__ = ["clear_device_cache", "find_executable_batch_size", "should_reduce_batch_size"]

Result = TypeVar("Result")

# The messages Accelerate treats as out of memory: CUDA, HIP and XPU (" out of memory."), MPS,
# cuDNN's refusal of a too-large workspace, the CPU allocator and Habana's HPU.
_OUT_OF_MEMORY = (
    " out of memory.",
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
)


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether ``exception`` says the batch did not fit: out of memory on any device.

    Example:
        >>> should_reduce_batch_size(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
        True
        >>> should_reduce_batch_size(ValueError("bad shape"))
        False
    """
    if isinstance(exception, torch.OutOfMemoryError):
        return True  # whatever its message says
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        text = exception.args[0]
        return isinstance(text, str) and any(marker in text for marker in _OUT_OF_MEMORY)
    return False


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Return the accelerator's cached memory to it (after ``gc.collect()`` when asked).

    Example:
        >>> clear_device_cache(garbage_collection=True)
    """
    if garbage_collection:
        gc.collect()
    accelerator = (
        torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    )
    if accelerator is not None:
        module = getattr(torch, accelerator.type, None)
        empty_cache = getattr(module, "empty_cache", None)
        if callable(empty_cache):
            empty_cache()


def find_executable_batch_size(
    function: Callable[..., Result] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Call ``function(batch_size, ...)`` with smaller sizes until one fits in memory.

    The decorated function is called without its first argument: the decorator passes the
    size. After an out-of-memory error the size is halved, or set to what
    ``reduce_batch_size_fn()`` returns (no arguments; a smaller size at each call). In a
    launch of several ranks every rank runs the same size: one rank out of memory restarts
    them all at the smaller size (not counted in ``max_restarts``).

    Args:
        function: The function to decorate; None when used as ``@find_executable_batch_size(...)``.
        starting_batch_size: The first size tried.
        reduce_batch_size_fn: The next size after an out-of-memory error (default: half).

    Returns:
        The decorated function, or a decorator when ``function`` is None.

    Raises:
        RuntimeError: The size reached zero ("No executable batch size found, reached zero."),
            or several ranks run where they cannot all be restarted (a ``WorkerPool``).
        TypeError: The caller passed the batch size, which the decorator passes itself.

    Example:
        >>> @find_executable_batch_size(starting_batch_size=64)
        ... def train(batch_size, steps):
        ...     if batch_size > 16:
        ...         raise RuntimeError("CUDA out of memory.")
        ...     return batch_size * steps
        >>> train(10)
        160
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    search = _Search(function, starting_batch_size, reduce_batch_size_fn)

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Result:
        return search.call(args, kwargs)

    return decorator


class _Search:
    """One decorated function's size, kept across its calls (as Accelerate keeps it)."""

    def __init__(
        self, function: Callable[..., Any], start: int, reduce: Callable[[], int] | None
    ) -> None:
        self.function = function
        self.start = start
        self.reduce = reduce
        self.size = start
        self.name = getattr(function, "__name__", repr(function))
        module = getattr(function, "__module__", None)
        self.key = f"{module}.{getattr(function, '__qualname__', self.name)}:{start}"

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the function at the current size; smaller after each out-of-memory error."""
        clear_device_cache(garbage_collection=True)
        self._refuse_the_batch_size_argument(args)
        rank, agreed = _launch_agreement(self.name)
        if agreed is not None:
            self.size = agreed.get(self.key, self.size)
        while True:
            if self.size <= 0:
                raise RuntimeError(self._reached_zero())
            try:
                return self.function(self.size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
                smaller = self._next_size()
                clear_device_cache(garbage_collection=True)
                if agreed is None:
                    self.size = smaller
                elif smaller <= 0:
                    raise RuntimeError(self._reached_zero()) from error
                else:  # the others may wait for this rank in a collective: all restart
                    raise BatchSizeReduction(
                        rank, self.size, smaller, self.name, self.key
                    ) from error

    def _next_size(self) -> int:
        """The next size below the current one.

        A launch restarts its ranks from the kernel's state, where ``reduce_batch_size_fn``
        starts again from its first answer: it is asked until it answers below the size that
        failed, replaying its sequence, and must answer smaller each time.
        """
        if self.reduce is None:
            return self.size // 2
        previous: int | None = None
        while True:
            answer = self.reduce()
            if not isinstance(answer, int) or (previous is not None and answer >= previous):
                raise ValueError(
                    f"reduce_batch_size_fn returned {answer!r} after {previous!r} for "
                    f"find_executable_batch_size of {self.name}: it must return a smaller int "
                    f"batch size at each call (the default halves the size)."
                )
            if answer < self.size:
                return answer
            previous = answer

    def _reached_zero(self) -> str:
        return (
            f"No executable batch size found, reached zero. {self.name} ran out of memory at "
            f"every batch size from starting_batch_size={self.start} down; free memory, "
            f"use a smaller model or sequence length, or start lower."
        )

    def _refuse_the_batch_size_argument(self, args: tuple[Any, ...]) -> None:
        """Accelerate's guard: more positional arguments than the function takes after its
        batch size means the caller passed the size too."""
        try:
            params = list(inspect.signature(self.function).parameters)
        except (TypeError, ValueError):
            return  # a builtin without a signature: nothing to check against
        if len(params) < len(args) + 1:
            given = ", ".join(
                f"{name}={value!r}" for name, value in zip(params[1:], args[1:], strict=False)
            )
            raise TypeError(
                f"Batch size was passed into `{self.name}` as the first argument when called. "
                f"Remove it, as the decorator passes it: `{self.name}({given})`"
            )


def _launch_agreement(name: str) -> tuple[int, dict[str, int] | None]:
    """This rank and the sizes its launch agreed on; (rank, None) when one process runs.

    Raises:
        RuntimeError: Several ranks run, but not in a launch that restarts them all.
    """
    context = current_launch()
    if context is not None:
        rank, world_size = context.rank, context.world_size
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return rank, None
    # Each machine's kernel restarts only its own ranks: across machines none can agree.
    agreed = agreed_sizes() if context is None or context.num_nodes == 1 else None
    if agreed is None:
        raise RuntimeError(
            f"find_executable_batch_size of {name} cannot search for a batch size on these "
            f"{world_size} ranks: a rank out of memory would leave the others waiting in a "
            f"collective, so every rank must restart at the smaller size, which only "
            f"notebook_launcher on one machine does (a WorkerPool or %%distributed cell would "
            f"lose its workers' state; a cluster run or torchrun cannot). Run it with "
            f"notebook_launcher(function, num_processes={world_size}) without cluster=, or "
            f"call the function undecorated with a batch size that fits."
        )
    return rank, agreed
