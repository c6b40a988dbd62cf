"""A pool worker's life: wait for a command from the kernel, run it, answer, until closed.

``WorkerPool`` (``launch/pool.py``) forks its workers through the launcher's own path, and the
function they run is :func:`serve_pool`: the worker entry has already detached from the kernel,
formed the process group and set the launch context when it starts, and tears them down when
it returns. Each command runs on this same thread (torch's thread pool, compiled graphs and the
current CUDA device stay put between cells) inside a fresh launch context, so metrics,
progress and the Stop button work per run exactly as in a launch.

Commands: ``cell`` (source code for the namespace), ``call`` (a function and its arguments),
``push``/``pull`` (names), ``check`` (is the process group still in step?) and ``close``.
Every command is answered with one ``pool_outcome`` message.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import pickle
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from notebook_kit.runtime.context import LaunchContext, active_launch, current_launch
from notebook_kit.worker import pool_namespace
from notebook_kit.worker.pool_interrupt import INTERRUPTED, Guard
from notebook_kit.worker.pool_namespace import dumps_by_value, namespace, run_cell

__all__ = ["OUTCOME_KIND", "READY_KIND", "PoolChannels", "serve_pool"]

OUTCOME_KIND = "pool_outcome"
READY_KIND = "pool_ready"
# Frames of these files come before the user's code in a traceback: not shown.
_HIDDEN_FILES = (__file__, sys.modules[Guard.__module__].__file__, pool_namespace.__file__)


@dataclass
class PoolChannels:
    """The pipes of every local rank, made by the kernel before forking.

    ``commands[i]``/``interrupts[i]`` are read by local rank ``i``; the kernel keeps the write
    ends (``senders``/``interrupters``), which every worker closes, so that a worker sees the
    end of its pipe when the kernel goes away.
    """

    commands: list[Connection]
    interrupts: list[Connection]
    senders: list[Connection]
    interrupters: list[Connection]

    def take(self, local_rank: int) -> tuple[Connection, Connection]:
        """In a worker: keep this rank's read ends, close every other end."""
        for index, pair in enumerate(zip(self.commands, self.interrupts, strict=True)):
            if index != local_rank:
                for connection in pair:
                    connection.close()
        for connection in (*self.senders, *self.interrupters):
            connection.close()
        return self.commands[local_rank], self.interrupts[local_rank]

    def close_readers(self) -> None:
        """In the kernel, once every worker is forked: the read ends are theirs now."""
        for connection in (*self.commands, *self.interrupts):
            connection.close()


def serve_pool(channels: PoolChannels) -> None:
    """A pool worker's function: serve the kernel's commands until the pool closes."""
    base = current_launch()
    assert base is not None, "serve_pool runs inside a worker launch"
    commands, interrupts = channels.take(base.local_rank)
    if base.device == "cuda":  # the current device is per thread: this one runs every cell
        torch.cuda.set_device(base.local_rank)
    guard = Guard(interrupts)
    guard.watch()
    loop = _Loop(base, guard)
    assert base.send is not None, "a pool worker talks to its kernel"
    base.send(READY_KIND, {"pid": os.getpid()})
    with contextlib.suppress(EOFError, OSError):  # the kernel went away: leave quietly
        while loop.serve(pickle.loads(commands.recv_bytes()), commands):
            pass


class _Loop:
    """Runs one command at a time and answers it."""

    def __init__(self, base: LaunchContext, guard: Guard) -> None:
        self.base = base
        self.guard = guard
        self.check_group = dist.new_group(backend="gloo") if base.backend == "nccl" else None
        self.collective_commands = 0  # commands every rank ran: the same on all of them

    def serve(self, header: tuple[str, int, bool], commands: Connection) -> bool:
        """Run one command (its body follows the header); False once the pool closes."""
        kind, command, want_value = header
        body = commands.recv_bytes()
        if kind == "close":
            return False
        if kind == "check":
            self._answer(command, *self._check(float(pickle.loads(body))), None)
            return True
        context = dataclasses.replace(self.base, prepared_models=[], extensions={})
        with active_launch(context):
            status, value = self.guard.run(command, lambda: self._run(kind, body, context))
            context.close()  # metrics still buffered reach the kernel before the answer
        self._answer_run(command, status, value, want_value)
        return True

    def _run(self, kind: str, body: bytes, context: LaunchContext) -> Any:
        request = pickle.loads(body)  # names and functions resolve in the namespace here
        space = namespace()
        space.update(request.get("shipped", {}))
        if kind == "cell":
            return run_cell(request["source"], request["filename"]), {}
        if kind == "call":
            function, args, kwargs = request["call"]
            value = function(*args, **kwargs)
            return value, _home_weights(context, request["home"])
        if kind == "push":
            space.update(request["values"])
            return None, {}
        if kind == "pull":
            if request["name"] not in space:
                raise NameError(f"name {request['name']!r} is not defined on this worker")
            return space[request["name"]], {}
        raise ValueError(f"unknown pool command {kind!r}")

    def _answer_run(self, command: int, status: str, value: Any, want_value: bool) -> None:
        if status == "error":
            self._answer(command, "error", _error_payload(value), None)
            return
        if status == INTERRUPTED:
            self._answer(command, INTERRUPTED, None, None)
            return
        result, weights = value
        payload: dict[str, Any] = {"weights": weights}
        if want_value:
            payload.update(_encode_value(result))
        self._answer(command, "ok", None, payload)

    def _answer(self, command: int, status: str, error: Any, payload: Any) -> None:
        libc_flush()  # what C code printed reaches the kernel before the answer
        answer = {"command": command, "status": status, "error": error, "payload": payload}
        assert self.base.send is not None
        self.base.send(OUTCOME_KIND, answer)

    def _check(self, timeout: float) -> tuple[str, Any]:
        """One small all-reduce with a deadline: do all ranks still meet in the same place?"""
        self.collective_commands += 1
        count = self.collective_commands
        ballot = torch.tensor([count, -count], dtype=torch.int64)
        try:
            work = dist.all_reduce(
                ballot, op=dist.ReduceOp.MAX, group=self.check_group, async_op=True
            )
            work.wait(timeout=timedelta(seconds=timeout))
        except Exception as error:
            return "error", {"message": f"{type(error).__name__}: {error}"}
        if int(ballot[0]) != -int(ballot[1]):
            return "error", {"message": "the ranks have run different numbers of commands"}
        return "ok", None


def _encode_value(value: Any) -> dict[str, Any]:
    """The value as bytes the kernel unpickles, or its text when it cannot be pickled."""
    if value is None:
        return {"value": None}
    try:
        return {"value": dumps_by_value(value)}
    except Exception as error:
        return {"repr": _safe_repr(value), "unpicklable": f"{type(error).__name__}: {error}"}


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as error:
        return f"<{type(value).__qualname__} object; repr failed: {error}>"


def _home_weights(context: LaunchContext, home: dict[int, Any]) -> dict[int, dict[str, Any]]:
    """State dicts of prepared models that the kernel holds, keyed by the kernel's id."""
    kernel_ids = {id(model): kernel_id for kernel_id, model in home.items()}
    weights = {}
    for model in context.prepared_models:
        kernel_id = kernel_ids.get(id(model))
        if kernel_id is not None:
            weights[kernel_id] = {
                key: value.detach().cpu() if isinstance(value, torch.Tensor) else value
                for key, value in model.state_dict().items()
            }
    return weights


def _error_payload(error: BaseException) -> dict[str, Any]:
    """The exception as data, its traceback starting in the user's code."""
    trace = error.__traceback__
    while trace is not None and trace.tb_frame.f_code.co_filename in _HIDDEN_FILES:
        trace = trace.tb_next
    text = "".join(traceback.format_exception(type(error), error, trace))
    qualified = f"{type(error).__module__}.{type(error).__qualname__}"
    return {
        "type": qualified.removeprefix("builtins."),
        "message": str(error),
        "traceback": text,
        "time": time.monotonic(),
    }


def libc_flush() -> None:
    """Flush C stdio buffers (a pipe makes them block-buffered) and Python's streams."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(Exception):
        _libc().fflush(None)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)
