"""A launch's call shipped by value to the template process, or what cannot be, named first.

cloudpickle sends what a notebook cell defines by value and the rest by module and name, as to
a cluster's node (:mod:`notebook_kit.launch.cluster.code_shipping`); the template runs on this
machine with the kernel's ``sys.path`` and folder, so whatever the kernel imports, it imports.
What pickle cannot carry at all (an open file, a lock, a socket, a generator) is found before
anything starts: the error names the argument, keyword, closure variable or global that holds
it, its type, and the fix.

A pipe end (a ``multiprocessing`` ``Connection``, as a pool's command pipes) or a descriptor
wrapped in :class:`PassedFd` (a pool's weights file) is not pickled by number, which would
name another file there: it travels beside the payload (``SCM_RIGHTS``) and is rebuilt on the
template's copy, as a fork would have inherited it.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from notebook_kit.worker.guardian import Call

__all__ = ["PassedFd", "UnshippableError", "fix_for", "ship_call", "unship"]


class UnshippableError(TypeError):
    """Part of a launch's call cannot be sent to the clean process its workers start from."""


class PassedFd:
    """A descriptor of the kernel's that a call needs by its number: in the template it
    unpickles as the number of the copy that was sent (valid until the fork is done)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd


def ship_call(call: Call, models: list[Any], reason: str, passed: list[int] | None = None) -> bytes:
    """``(call, models)`` cloudpickled in one piece, so each model stays the object the
    function reaches (the template maps its weights home by position in ``models``).

    ``passed`` gets the descriptors to send beside it, in order: each ``Connection`` and
    :class:`PassedFd` the call holds.

    Raises:
        UnshippableError: a part cannot be pickled; ``reason`` says why the workers do not
            start from the kernel.
    """
    buffer = io.BytesIO()
    try:
        _FdPickler(buffer, [] if passed is None else passed).dump((call, models))
    except Exception as error:
        raise UnshippableError(_explain(call, error, reason)) from error
    return buffer.getvalue()


def unship(payload: bytes, fds: list[int]) -> Any:
    """In the template: the shipped ``(call, models)``, its descriptors the ``fds`` received.

    A ``Connection`` owns a copy of its descriptor, so the caller closes ``fds`` as usual.
    """
    global _received
    _received = fds
    try:
        return pickle.loads(payload)
    finally:
        _received = []


_received: list[int] = []  # the descriptors of the payload being unpickled (the template's)


class _FdPickler(cloudpickle.Pickler):
    """cloudpickle, with descriptors recorded for sending instead of pickled by number."""

    def __init__(self, file: io.BytesIO, passed: list[int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.passed = passed

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, Connection):
            self.passed.append(obj.fileno())
            return _connection, (len(self.passed) - 1, obj.readable, obj.writable)
        if isinstance(obj, PassedFd):
            self.passed.append(obj.fd)
            return _descriptor, (len(self.passed) - 1,)
        return super().reducer_override(obj)


def _connection(index: int, readable: bool, writable: bool) -> Connection:
    return Connection(os.dup(_received[index]), readable=readable, writable=writable)


def _descriptor(index: int) -> int:
    return _received[index]


def _explain(call: Call, error: Exception, reason: str) -> str:
    where, culprit, failure = _first_unpicklable(call) or ("the call", None, error)
    kind = type(culprit).__qualname__ if culprit is not None else "an object"
    function = getattr(call[0], "__qualname__", repr(call[0]))
    return (
        f"{reason}, so the function {function} and its arguments must be sent there by value, "
        f"but {where} ({kind}) cannot be pickled: {failure}. {fix_for(culprit)} Or restart the "
        "kernel and launch before it creates a CUDA context or a process group."
    )


def fix_for(culprit: Any) -> str:
    """What to do instead of sending ``culprit``, for the usual culprits (a file, a lock).

    Example:
        >>> import threading
        >>> fix_for(threading.Lock())
        'Create the lock inside the function (each worker needs its own anyway).'
    """
    module, name = type(culprit).__module__, type(culprit).__name__.lower()
    if isinstance(culprit, io.IOBase) or module in ("_io", "io"):
        return "Pass the file's path instead and open it inside the function."
    if any(word in name for word in ("lock", "condition", "semaphore")):
        return "Create the lock inside the function (each worker needs its own anyway)."
    return "Create it inside the function, or pass what it is built from."


def _first_unpicklable(call: Call) -> tuple[str, Any, Exception] | None:
    """Where the call holds the first value pickle refuses, that value and pickle's error."""
    for where, value in _parts(call):
        try:
            cloudpickle.dumps(value)
        except Exception as error:
            return where, value, error
    return None


def _parts(call: Call) -> Iterator[tuple[str, Any]]:
    """The call's pieces, each named as the user wrote it."""
    function, args, kwargs = call
    for index, value in enumerate(args):
        yield f"args[{index}]", value
    for name, value in kwargs.items():
        yield f"the keyword argument {name!r}", value
    yield from _function_parts(function)


def _function_parts(function: Callable[..., Any]) -> Iterator[tuple[str, Any]]:
    code = getattr(function, "__code__", None)
    if code is None:
        return
    for name, cell in zip(code.co_freevars, function.__closure__ or (), strict=False):
        try:
            yield f"the variable {name!r} of its closure", cell.cell_contents
        except ValueError:  # an empty cell
            continue
    namespace = getattr(function, "__globals__", {})
    for name in code.co_names:
        if name in namespace:
            yield f"the global {name!r}", namespace[name]
