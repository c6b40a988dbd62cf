"""A pool worker's life: wait for a command from the kernel, run it, answer, until closed.

``WorkerPool`` (``launch/pool/``) forks its workers through the launcher's own path, and the
function they run is :func:`serve_pool`: the worker entry has already detached from the kernel,
formed the process group and set the launch context when it starts, and tears them down when
it returns. Each command runs on this same thread (torch's thread pool, compiled graphs and the
current CUDA device stay put between cells) inside a fresh launch context, so metrics,
progress and the Stop button work per run exactly as in a launch.

Commands (:mod:`notebook_kit.runtime.pool_commands`, one typed request at a time on the
command pipe): a cell (source code for the namespace), a call (a function and its arguments),
push and pull (names), a check (is the process group still in step?), debug and close. Every
command but close is answered with one :class:`~notebook_kit.runtime.messages.PoolAnswer`.

The exception of the last command that failed here is kept, with its frames, until the next
command (but a check or a debug) drops it: debug opens pdb on it at the kernel's prompt
(``pool.debug()``), and with ``post_mortem=True`` a failed command opens it before answering.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import dataclasses
import functools
import os
import pickle
import sys
import types
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from notebook_kit.runtime import pool_commands
from notebook_kit.runtime.context import LaunchContext, active_launch, current_launch
from notebook_kit.runtime.messages import Failure, PoolAnswer, Started, weights_of
from notebook_kit.runtime.weights_file import gather_and_store
from notebook_kit.worker.debugger import post_mortem, worth_a_post_mortem
from notebook_kit.worker.host_pickling import dumps_for_kernel
from notebook_kit.worker.memory_history import note_out_of_memory
from notebook_kit.worker.pool import namespace as pool_namespace
from notebook_kit.worker.pool.interrupt import INTERRUPTED, Guard
from notebook_kit.worker.pool.namespace import namespace, run_cell
from notebook_kit.worker.pool.reloading import PoolReloader

__all__ = ["PoolChannels", "serve_pool"]

# Frames of these files come before the user's code in a traceback: not shown.
_HIDDEN_FILES = (
    __file__,
    sys.modules[Guard.__module__].__file__,
    pool_namespace.__file__,
    sys.modules[PoolReloader.__module__].__file__,
)


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


def serve_pool(
    channels: PoolChannels,
    post_mortem: bool = False,
    weights_fd: int | None = None,
    own_main: bool = False,
) -> None:
    """A pool worker's function: serve the kernel's commands until the pool closes.

    ``post_mortem``: a command that raises opens pdb in its failing frame before answering.
    ``weights_fd``: this worker's descriptor of the kernel's weights file, when its number
    differs from the kernel's (a worker the clean template forked); ``own_main``: cells run
    in a new, empty ``__main__``, not the module of the process this was forked from.
    """
    base = current_launch()
    assert base is not None, "serve_pool runs inside a worker launch"
    if own_main:  # as a script's: a function sent before any cell ran finds the builtins
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
    commands, interrupts = channels.take(base.local_rank)
    if base.device == "cuda":  # the current device is per thread: this one runs every cell
        torch.cuda.set_device(base.local_rank)
    guard = Guard(interrupts)
    guard.watch()
    loop = _Loop(base, guard, post_mortem)
    loop.weights_fd = weights_fd
    assert base.send is not None, "a pool worker talks to its kernel"
    base.send(Started(base.rank, os.getpid()))
    with contextlib.suppress(EOFError, OSError):  # the kernel went away: leave quietly
        while loop.serve(pool_commands.decode(commands.recv_bytes())):
            pass


class _Loop:
    """Runs one command at a time and answers it."""

    def __init__(self, base: LaunchContext, guard: Guard, post_mortem: bool = False) -> None:
        self.base = base
        self.guard = guard
        self.post_mortem = post_mortem
        self.failed: BaseException | None = None  # the last failed command's, for debug
        # The check meets in a group of its own: in the default group it could pair with a
        # collective that one rank left pending there and pass.
        self.check_group = dist.new_group(backend="gloo")
        self.collective_commands = 0  # commands every rank ran: the same on all of them
        self.reloader = PoolReloader()  # what the worker holds now is current
        self.weights_fd: int | None = None  # the kernel's file under this worker's number

    def serve(self, request: pool_commands.PoolRequest) -> bool:
        """Run one command; False once the pool closes."""
        command, number = request.command, request.number
        if isinstance(command, pool_commands.PoolClose):
            return False
        if isinstance(command, pool_commands.PoolCheck):
            status, detail = self._check(pool_commands.CHECK_SECONDS)
            self._answer(PoolAnswer(number, status, detail=detail))
            return True
        if not isinstance(command, pool_commands.PoolDebug):
            self.failed = None  # its frames hold what the failed command made: let them go
        context = dataclasses.replace(
            self.base, prepared_models=[], extensions={}, weight_gatherers={}, gathered_weights={}
        )
        with active_launch(context):
            status, value = self.guard.run(number, lambda: self._run(command, context))
            context.close()  # metrics still buffered reach the kernel before the answer
        self.reloader.note_new_modules()  # what this command imported is current
        self._answer_run(number, status, value, request.want_value)
        return True

    def _run(self, command: pool_commands.PoolCommand, context: LaunchContext) -> Any:
        # Edited modules first: the payload's functions and classes then unpickle as new.
        order = getattr(command, "reload", None)
        if order is not None:
            self.reloader.apply(order)
        # The user's objects are unpickled here: their names resolve in the namespace.
        space = namespace()
        if isinstance(command, pool_commands.PoolCell):
            space.update(pickle.loads(command.payload))
            return run_cell(command.source, command.filename), {}
        if isinstance(command, pool_commands.PoolCall):
            shipped, (function, args, kwargs), home = pickle.loads(command.payload)
            space.update(shipped)
            value = function(*args, **kwargs)
            fd = command.weights_fd
            if fd is not None and self.weights_fd is not None:
                fd = self.weights_fd  # the same file, as the template passed it
            return value, self._weights_home(home, fd, context)
        if isinstance(command, pool_commands.PoolPush):
            space.update(pickle.loads(command.payload))
            return None, {}
        if isinstance(command, pool_commands.PoolDebug):
            if self.failed is None:  # the kernel refuses first; a stale request says so here
                raise RuntimeError("no command failed on this rank since the last one")
            post_mortem(self.failed)
            return None, {}
        if isinstance(command, pool_commands.PoolPull):
            if command.name not in space:
                raise NameError(f"name {command.name!r} is not defined on this worker")
            return space[command.name], {}
        raise ValueError(f"unknown pool command {type(command).__name__}")

    def _weights_home(
        self, home: dict[int, Any], fd: int | None, context: LaunchContext
    ) -> dict[int, Any]:
        """The trained weights of the kernel's models, after a ``call``; every rank joins.

        With the kernel's weights file (a local pool), sharded models are gathered one tensor
        at a time and rank 0 writes each there; without it (a node of a cluster pool), the
        strategy's gatherer runs and the weights travel in the answer.
        """
        # The kernel's models arrived as copies: map each copy's id to the kernel's.
        kernel_ids = {id(model): kernel_id for kernel_id, model in home.items()}
        if fd is None:  # sharded models are gathered by every rank, before rank 0 sends them
            context.gather_weights(kernel_ids)
            if self.base.rank != 0:  # the kernel loads global rank 0's weights only
                return {}
            return weights_of(context.prepared_models, kernel_ids, context.gathered_weights)
        sharded = context.weight_gatherers.__contains__
        writer = fd if self.base.rank == 0 else None  # the kernel loads rank 0's weights only
        models = context.prepared_models
        return gather_and_store(writer, models, kernel_ids, lambda model: sharded(id(model)))

    def _answer_run(self, command: int, status: str, value: Any, want_value: bool) -> None:
        if status == "error":
            note_out_of_memory(value)  # memory_history: its snapshot and note, in the traceback
            if self.failed is None:  # (a debug that failed keeps the command it was for)
                self.failed = value
                if self.post_mortem and worth_a_post_mortem(value):
                    self._post_mortem_now(value)
            failure = Failure.from_exception(value, value.__traceback__, _HIDDEN_FILES, False)
            self._answer(PoolAnswer(command, "error", failure=failure))
            return
        if status == INTERRUPTED:
            self._answer(PoolAnswer(command, INTERRUPTED))
            return
        result, weights = value
        encoded = _encode_value(result) if want_value else None
        self._answer(PoolAnswer(command, "ok", weights=weights, value=encoded))

    def _post_mortem_now(self, error: BaseException) -> None:
        """``post_mortem=True``: pdb in the failing frame, before the kernel hears of it (the
        other ranks run on meanwhile, or wait for this one); Ctrl-C there ends only pdb."""
        with contextlib.suppress(KeyboardInterrupt):
            post_mortem(error)

    def _answer(self, answer: PoolAnswer) -> None:
        libc_flush()  # what C code printed reaches the kernel before the answer
        assert self.base.send is not None
        self.base.send(answer)

    def _check(self, timeout: float) -> tuple[str, str | None]:
        """One small all-reduce with a deadline: do all ranks still meet in the same place?

        Each rank votes the commands it ran and the collectives it started in the default
        group (its sequence number); MAX of a number and of its negation differ unless every
        rank voted the same, so a collective one rank left pending is found every time.
        """
        self.collective_commands += 1
        count = self.collective_commands
        calls = _default_group_calls()
        ballot = torch.tensor([count, -count, calls, -calls], dtype=torch.int64)
        try:
            work = dist.all_reduce(
                ballot, op=dist.ReduceOp.MAX, group=self.check_group, async_op=True
            )
            work.wait(timeout=timedelta(seconds=timeout))
        except Exception as error:
            return "error", f"{type(error).__name__}: {error}"
        if int(ballot[0]) != -int(ballot[1]):
            return "error", "the ranks have run different numbers of commands"
        if int(ballot[2]) != -int(ballot[3]):
            return "error", (
                "the ranks have started different numbers of collectives in the default "
                f"process group (between {-int(ballot[3])} and {int(ballot[2])}): one was left "
                "pending on some rank"
            )
        return "ok", None


def _default_group_calls() -> int:
    """How many collectives this rank has started in the default group (-1: not known)."""
    try:
        group = dist.distributed_c10d._get_default_group()
        return int(group._get_sequence_number_for_group())
    except (AttributeError, RuntimeError):  # a torch without it: the command count alone
        return -1


def _encode_value(value: Any) -> dict[str, Any]:
    """The value as bytes the kernel unpickles, or its text when it cannot be pickled."""
    if value is None:
        return {"value": None}
    try:
        return {"value": dumps_for_kernel(value, by_value=True)}
    except Exception as error:
        return {"repr": _safe_repr(value), "unpicklable": f"{type(error).__name__}: {error}"}


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as error:
        return f"<{type(value).__qualname__} object; repr failed: {error}>"


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
