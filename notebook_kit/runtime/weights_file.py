"""Trained weights on their way home, through an anonymous file in shared memory.

Pickled into a message, a model's state costs rank 0 a pickled copy and the kernel the
received bytes plus the unpickled tensors: a 1 GiB model raised the kernel's memory by 3 GiB
as it came home. Instead the kernel opens an anonymous file in shared memory (tmpfs) before it
forks, rank 0 writes each tensor into it, one at a time, and its message says only where each
one lies (:class:`StoredTensor`). The kernel maps the file and loads each state dict from
tensors that are views of the mapping: the weights exist once on their way home, the file has
no name to leak, and its memory is freed with the last descriptor.

Only plain dense tensors (on any device) travel through the file; anything else in a state
dict (``_extra_state``, a quantized or sparse tensor) travels in the message as before.

Example::

    home = WeightsFile()                     # in the kernel, before forking
    # ... in rank 0, forked: the same descriptor
    states = store_states(home.fd, {kernel_id: model.state_dict()})
    # ... back in the kernel, with ``states`` from rank 0's message
    load_states(home.fd, states, lambda kernel_id, state, release: model.load_state_dict(state))
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

__all__ = [
    "StoredTensor",
    "WeightsFile",
    "WeightsFileError",
    "gather_and_store",
    "home_states",
    "load_states",
    "read_states",
    "store_home_weights",
    "store_states",
]

_ALIGN = 64  # every tensor starts on a boundary any dtype can be viewed at
_MAX_WRITE = 1 << 30  # bytes per pwrite: Linux writes at most about 2 GiB at once


class StoredTensor(NamedTuple):
    """Where rank 0 wrote one tensor in the weights file, and how to view it again."""

    offset: int
    nbytes: int
    dtype: str  # a torch dtype's name: "float32", "bfloat16"
    shape: tuple[int, ...]


class WeightsFileError(RuntimeError):
    """The weights file does not hold what rank 0's message says it wrote."""


class WeightsFile:
    """An anonymous file in shared memory, opened by the kernel and inherited by its forks.

    Example::

        with WeightsFile() as home:
            fork_workers(..., weights_fd=home.fd)
    """

    def __init__(self) -> None:
        self.fd = _anonymous_file()
        self._owner = os.getpid()  # a fork holds a copy of this object, not the file to close

    def clear(self) -> None:
        """Give the file's memory back (what an earlier attempt or command wrote)."""
        if self.fd >= 0:
            os.ftruncate(self.fd, 0)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> WeightsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if os.getpid() == self._owner:
                self.close()


def _anonymous_file() -> int:
    """A file with no name in shared memory: nothing to remove, whatever ends the kernel."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("notebook_kit-weights")  # close-on-exec: forks only
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryFile(dir=shm) as handle:  # unlinked at once: no name either
        return os.dup(handle.fileno())


def home_states(
    models: Iterable[Any],
    kernel_ids: Mapping[int, int],
    gathered: Mapping[int, dict[str, Any]] | None = None,
) -> dict[int, dict[str, Any]]:
    """The state dicts of the ``models`` the kernel holds, by the kernel's ``id`` of each.

    ``kernel_ids`` maps a model's ``id`` here to its ``id`` in the kernel; ``gathered`` holds
    the full state of sharded models by ``id`` here (their own ``state_dict`` is a shard).
    The tensors are the models' own (no copy is made here).
    """
    states = {}
    for model in models:
        kernel_id = kernel_ids.get(id(model))
        if kernel_id is not None:
            state = (gathered or {}).get(id(model))
            states[kernel_id] = model.state_dict() if state is None else state
    return states


def store_states(fd: int, states: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """Write every tensor of ``states`` into the file ``fd``, one at a time, from offset 0.

    Returns the same states with a :class:`StoredTensor` in place of each tensor written. A
    tensor on a device is copied to the CPU on its own, so the writer's memory grows by one
    tensor at most; tensors sharing memory (tied weights) are written once.
    """
    writer = _Writer(fd)
    return {kernel_id: writer.state(state.items()) for kernel_id, state in states.items()}


def store_home_weights(
    fd: int,
    models: Iterable[Any],
    kernel_ids: Mapping[int, int],
    gathered: Mapping[int, dict[str, Any]] | None = None,
) -> dict[int, dict[str, Any]] | None:
    """:func:`store_states` of :func:`home_states`; None when the file could not take them
    (shared memory full), and the message must carry them as before."""
    try:
        return store_states(fd, home_states(models, kernel_ids, gathered))
    except OSError as error:
        print(f"The trained weights go home in the message instead: {error}", file=sys.stderr)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        return None


def gather_and_store(
    fd: int | None,
    models: Iterable[Any],
    kernel_ids: Mapping[int, int],
    sharded: Callable[[Any], bool],
) -> dict[int, dict[str, Any]]:
    """Every rank: the ``sharded`` models are gathered one tensor at a time (a collective per
    tensor, in the same order everywhere); rank 0 (``fd`` given) writes each, as
    :func:`store_states`, and frees it before the next, so it never holds a whole model more.

    Returns, on rank 0, the stored states of every model of ``kernel_ids``; {} elsewhere.
    """
    writer = _Writer(fd) if fd is not None else None
    stored: dict[int, dict[str, Any]] = {}
    for model in models:
        kernel_id = kernel_ids.get(id(model))
        if kernel_id is None:
            continue
        gathered = sharded(model)
        items = _gathered_items(model) if gathered else model.state_dict().items()
        if writer is not None:  # a gathered tensor is freed once written: its address is reused
            stored[kernel_id] = writer.state(items, tied=not gathered)
        else:
            for _ in items:  # joins rank 0's gathers
                pass
    return stored


def _gathered_items(model: Any) -> Iterator[tuple[str, Any]]:
    """A sharded model's full state, one whole tensor at a time (each a collective)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.tensor import DTensor

    for key, value in get_model_state_dict(model).items():  # names as the unsharded model's
        if isinstance(value, DTensor):
            groups = value.device_mesh.get_all_groups()  # one per dimension (HSDP, TP × FSDP)
            nccl = any(dist.get_backend(group) == "nccl" for group in groups)
            if value.device.type == "cpu" and nccl:
                value = value.cuda()  # offloaded to the CPU: NCCL gathers on the GPU
            value = value.full_tensor()
        yield key, value


class _Writer:
    """Tensors written one after another into the file, each where any dtype can view it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.offset = 0
        self.written: dict[tuple[Any, ...], StoredTensor] = {}
        os.ftruncate(fd, 0)

    def state(self, items: Iterable[tuple[str, Any]], tied: bool = True) -> dict[str, Any]:
        """``tied``: the tensors stay alive meanwhile, so one address is one tensor."""
        return {key: self.tensor(value, tied) for key, value in items}

    def tensor(self, value: Any, tied: bool = True) -> Any:
        import torch  # loaded wherever a model was prepared

        if not _travels_in_file(value, torch):
            return value
        same = _identity(value) if tied else None
        slot = self.written.get(same) if same is not None else None
        if slot is None:
            slot = _write_tensor(self.fd, value, self.offset)
            self.offset = -(-(self.offset + slot.nbytes) // _ALIGN) * _ALIGN
            if same is not None:
                self.written[same] = slot
        return slot


def _travels_in_file(value: Any, torch: Any) -> bool:
    return (
        type(value) in (torch.Tensor, torch.nn.Parameter)
        and value.layout == torch.strided
        and not value.is_quantized
        and value.device.type != "meta"
    )


def _identity(tensor: Any) -> tuple[Any, ...] | None:
    """The same memory viewed the same way: tied weights appear under two keys."""
    pointer = tensor.untyped_storage().data_ptr()
    if pointer == 0:
        return None
    view = (tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
    return (tensor.device, pointer, tensor.dtype, *view)


def _write_tensor(fd: int, tensor: Any, offset: int) -> StoredTensor:
    import torch

    host = tensor.detach()
    if host.device.type != "cpu":
        host = host.cpu()  # this tensor alone, freed once written
    host = host.contiguous()
    raw = memoryview(host.reshape(-1).view(torch.uint8).numpy())
    done = 0
    while done < len(raw):
        done += os.pwrite(fd, raw[done : done + _MAX_WRITE], offset + done)
    dtype = str(host.dtype).removeprefix("torch.")
    return StoredTensor(offset, len(raw), dtype, tuple(host.shape))


def load_states(
    fd: int | None,
    states: Mapping[int, Mapping[str, Any]],
    load: Callable[[int, dict[str, Any], Callable[[], None]], None],
) -> None:
    """Call ``load(kernel_id, state, release)`` for each of ``states``, stored tensors read
    from ``fd``.

    Each :class:`StoredTensor` becomes a view of the mapped file, valid during its ``load``
    only (``load_state_dict`` copies). The file is mapped, not read: the pages a copy touches
    are the file's own, and they leave this process's memory after each model, or whenever
    ``load`` calls ``release()`` (views stay valid: their pages come back if read). Raises
    :class:`WeightsFileError` before anything is loaded if the file holds less than the
    message says rank 0 wrote.
    """
    slots = [value for state in states.values() for value in state.values() if _is_slot(value)]
    if not slots:
        for kernel_id, state in states.items():
            load(kernel_id, dict(state), _nothing)
        return
    if fd is None:
        raise WeightsFileError("rank 0 wrote the weights to a file this process does not hold")
    size = os.fstat(fd).st_size
    needed = max(slot.offset + slot.nbytes for slot in slots)
    if size < needed:
        raise WeightsFileError(
            f"the weights file holds {size} bytes of the {needed} rank 0 said it wrote; "
            f"nothing was loaded, so the kernel's models are as they were before the run"
        )
    import torch

    mapping = mmap.mmap(fd, size)

    def release() -> None:
        if hasattr(mmap, "MADV_DONTNEED"):  # the file keeps the bytes; this process drops them
            mapping.madvise(mmap.MADV_DONTNEED)

    try:
        for kernel_id, state in states.items():
            base = torch.frombuffer(mapping, dtype=torch.uint8)
            views = {key: _view(base, value, torch) for key, value in state.items()}
            del base
            load(kernel_id, views, release)
            del views
            release()
    finally:
        with contextlib.suppress(BufferError):  # a view still alive: unmapped when it goes
            mapping.close()


def read_states(
    fd: int | None, states: Mapping[int, Mapping[str, Any]]
) -> dict[int, dict[str, Any]]:
    """``states`` with every stored tensor read from ``fd`` into a tensor of its own.

    For a process that sends the weights on (a cluster's node process): they are all in its
    memory at once.
    """
    copies: dict[int, dict[str, Any]] = {}

    def keep(kernel_id: int, state: dict[str, Any], release: Callable[[], None]) -> None:
        sent = states[kernel_id]
        copies[kernel_id] = {
            key: state[key].clone() if _is_slot(value) else value for key, value in sent.items()
        }

    load_states(fd, states, keep)
    return copies


def _nothing() -> None:
    """Nothing mapped, nothing to release."""


def _is_slot(value: Any) -> bool:
    return isinstance(value, StoredTensor)


def _view(base: Any, value: Any, torch: Any) -> Any:
    if not _is_slot(value):
        return value
    slot: StoredTensor = value
    dtype = getattr(torch, slot.dtype)
    return base[slot.offset : slot.offset + slot.nbytes].view(dtype).view(slot.shape)
