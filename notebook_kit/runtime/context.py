"""Per-process launch context: what a worker knows about the launch that started it.

The launcher creates one :class:`LaunchContext` in every worker right after the fork (and
around an in-process run with ``num_processes=1``). The Accelerator and the metrics channel
read it; nothing else is shared between the kernel and the workers. A context made in the
kernel never reaches a worker: the worker entry replaces it before the user's function runs.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from notebook_kit.runtime.messages import Send

__all__ = ["LaunchContext", "LaunchHook", "StopFlag", "add_launch_hook", "current_launch"]


class StopFlag:
    """Two bytes of memory shared between the kernel and its forked workers.

    The first says why the run should stop: the kernel sets it (the Stop button); a node told
    it will be taken away (SIGTERM: a preempted VM, a job at its time limit) sets it with the
    cause :data:`PREEMPTED`. The second marks that the launch itself is ending its workers
    (:meth:`end`), so a worker tells the launch's SIGTERM from the machine's. Workers read them
    without any system call. It is an anonymous shared mapping created before the fork, so it
    needs no file and no port.
    """

    STOPPED = 1  # the Stop button, or the kernel
    PREEMPTED = 2  # the node received SIGTERM; wins over STOPPED in the ranks' vote

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, 2)

    def set(self) -> None:
        if self._memory[0] == 0:
            self._memory[0] = self.STOPPED

    def preempt(self) -> None:
        """Ask the run to stop because this node is going away (from a signal handler too)."""
        self._memory[0] = self.PREEMPTED

    def end(self) -> None:
        """The launch is stopping its workers: a SIGTERM from here on is the launch's."""
        self._memory[1] = 1

    @property
    def ending(self) -> bool:
        return self._memory[1] == 1

    def clear(self) -> None:
        self._memory[0] = self._memory[1] = 0

    def is_set(self) -> bool:
        return self._memory[0] != 0

    @property
    def cause(self) -> int:
        """0 while not set, else :data:`STOPPED` or :data:`PREEMPTED`."""
        return self._memory[0]

    def close(self) -> None:
        self._memory.close()


@dataclass
class LaunchContext:
    """What one process of a launch knows about it.

    Attributes:
        rank: Global rank of this process.
        local_rank: Rank on this node.
        world_size: Number of processes in the whole job.
        local_world_size: Number of processes on this node.
        node_rank: Index of this node.
        num_nodes: Number of nodes.
        backend: The torch.distributed backend of the process group ("gloo" or "nccl").
        device: Where the launch put this process: "cuda" (its own GPU, ``cuda:local_rank``)
            or "cpu".
        mixed_precision: Launch-level mixed precision (None: let the Accelerator decide).
        gradient_accumulation_steps: Launch-level accumulation (None: Accelerator default).
        storage_timeout: Seconds a checkpoint save waits on silent storage (None: not set by
            a launch; ``NOTEBOOK_KIT_STORAGE_TIMEOUT`` or the default decides).
        send: Sends a message (:mod:`notebook_kit.runtime.messages`) to the kernel; None when
            there is no kernel to talk to.
        stop_flag: Set by the kernel to ask the training loop to stop; None if unsupported.
        prepared_models: Modules given to ``Accelerator.prepare`` in this process, in order.
        weight_gatherers: For sharded models (FSDP), ``id(model)`` -> a collective that
            returns the whole state dict on rank 0; every rank runs it when the function ends.
        gathered_weights: What those gatherers returned, by ``id(model)``.
        restart_count: How many times the launch restarted its workers after a failure.
        mesh_coordinates: This rank's place in the Accelerator's device mesh
            (``dp_replicate=1, dp_shard=0``), named in its failure; "" without one.
        extensions: Per-launch state of feature modules (the metrics channel, stop votes),
            keyed by module; values with a ``close()`` method are closed by :meth:`close`.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    backend: str = "gloo"
    device: str = "cpu"
    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    storage_timeout: int | None = None
    send: Send | None = None
    stop_flag: StopFlag | None = None
    prepared_models: list[Any] = field(default_factory=list)
    weight_gatherers: dict[int, Callable[[Any], dict[str, Any]]] = field(default_factory=dict)
    gathered_weights: dict[int, dict[str, Any]] = field(default_factory=dict)
    restart_count: int = 0
    mesh_coordinates: str = ""
    extensions: dict[str, Any] = field(default_factory=dict)

    def stop_cause(self) -> int:
        """Why this process was asked to stop: 0 (not asked) or a :class:`StopFlag` cause."""
        return 0 if self.stop_flag is None else self.stop_flag.cause

    def close(self) -> None:
        """End of the user's function: close what the feature modules opened (flushes)."""
        for extension in self.extensions.values():
            close = getattr(extension, "close", None)
            if callable(close):
                close()

    def register_prepared_model(self, model: Any) -> None:
        """Remember a model given to ``prepare`` so its trained weights can go home."""
        if not any(existing is model for existing in self.prepared_models):
            self.prepared_models.append(model)

    def register_weights_gatherer(
        self, model: Any, gather: Callable[[Any], dict[str, Any]]
    ) -> None:
        """A sharded model's weights go home through ``gather(model)``, a collective."""
        self.weight_gatherers[id(model)] = gather

    def gather_weights(self, model_ids: Iterable[int]) -> None:
        """Run on every rank once the function returned: gathers the sharded models among
        ``model_ids`` (the ones going home), so rank 0 can send them whole."""
        wanted = set(model_ids)
        for model in self.prepared_models:
            gather = self.weight_gatherers.get(id(model))
            if gather is not None and id(model) in wanted:
                self.gathered_weights[id(model)] = gather(model)


_current: LaunchContext | None = None

# Called with the context when a launch becomes active in a process; what it returns (a
# context manager, or None) is exited when the launch ends. Framework integrations register
# here, so a launched function needs no call of ours to get them.
LaunchHook = Callable[[LaunchContext], contextlib.AbstractContextManager[Any] | None]
_launch_hooks: list[LaunchHook] = []


def add_launch_hook(hook: LaunchHook) -> None:
    """Run ``hook(context)`` whenever a launch becomes active in a process (once per hook).

    Hooks registered in the kernel before the fork are inherited by every worker.

    Example:
        >>> add_launch_hook(lambda context: print("rank", context.rank, "starts"))
    """
    if hook not in _launch_hooks:
        _launch_hooks.append(hook)


def current_launch() -> LaunchContext | None:
    """The launch this process belongs to, or None outside any launch."""
    return _current


@contextlib.contextmanager
def active_launch(context: LaunchContext) -> Iterator[LaunchContext]:
    """Make ``context`` the current launch for the duration of the block, with its hooks."""
    global _current
    previous, _current = _current, context
    try:
        with contextlib.ExitStack() as hooks:
            for hook in list(_launch_hooks):
                entered = hook(context)
                if entered is not None:
                    hooks.enter_context(entered)
            yield context
    finally:
        _current = previous


@contextlib.contextmanager
def temporary_environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then put back what was there.

    Example:
        >>> with temporary_environment({"RANK": "0"}):
        ...     os.environ["RANK"]
        '0'
    """
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
