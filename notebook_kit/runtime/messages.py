"""What a worker tells the kernel, as typed data: one frozen dataclass per kind of message.

A worker hands a message to ``LaunchContext.send``; a forked worker's pipe carries it as the
codec's plain data (:func:`encode`, :func:`decode`: msgpack, no pickle but for a user's value
or tensors inside a :class:`Result` or :class:`PoolAnswer`), and a process that runs the
function itself (one process, torchrun) hands it over as it is. So the kernel side
(supervisor, pool, live view) only ever sees these classes. Output lines do not travel here
(they come through the worker's stdout and stderr pipes) but have their type too,
:class:`OutputLine`, for whoever keeps them.

Lives in ``runtime`` because both sides import it: the worker to encode, the kernel to decode.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from notebook_kit.errors import WorkerFailure
from notebook_kit.runtime import codec

__all__ = [
    "DebuggerLeft",
    "DebuggerLine",
    "DebuggerPrompt",
    "Failure",
    "Finished",
    "MetricsBatch",
    "OutputLine",
    "PoolAnswer",
    "ProfileDone",
    "ProfileOrder",
    "Progress",
    "RankSpeed",
    "Record",
    "Result",
    "Stacks",
    "Started",
    "WorkerMessage",
    "decode",
    "decode_line",
    "encode",
    "encode_line",
    "plain_values",
    "weights_of",
]

Record = tuple[int, int | None, dict[str, float]]  # rank, step (None: count the calls), values


@dataclass(frozen=True)
class Started:
    """A persistent (pool) worker formed the process group and waits for commands."""

    rank: int
    pid: int


@dataclass(frozen=True)
class Progress:
    """Rank 0's progress counters, carried with each metrics batch it sends."""

    steps: int | None = None  # None: this batch says nothing about the count
    total: int | None = None
    epoch_length: int | None = None


@dataclass(frozen=True)
class RankSpeed:
    """What one rank counted of its training so far, and the most memory it has held.

    ``samples`` and ``batches`` come from the prepared training loader (each batch's first
    dimension) or from ``notebook_kit.log(..., samples=n)``; ``tokens`` are the non-padding
    tokens of batches that carry an ``attention_mask`` (or all of ``input_ids``), None when no
    batch carried tokens. ``seconds`` runs from the first counted batch to the latest count
    (the end of the function, once it returned), on this rank's own clock. Memory figures are
    peaks in bytes: resident memory of the process, and on a GPU the caching allocator's
    maximum allocated and reserved (None off the GPU).

    Where the steps went (:class:`~notebook_kit.runtime.step_clock.StepClock`), as running
    sums over ``timed_steps`` steps: ``step_seconds`` in all, ``data_seconds`` waiting for the
    loader (None: no prepared loader was timed) and ``wait_seconds`` blocked on collectives
    (None: the strategy reports none). ``flops`` are the model FLOPs of the counted batches
    (None: the model's are not known) and ``peak_flops`` the device's peak per second at the
    run's precision (None: not a GPU of the table).
    """

    samples: int = 0
    batches: int = 0
    tokens: int | None = None
    seconds: float = 0.0
    peak_memory_bytes: int | None = None
    cuda_max_allocated: int | None = None
    cuda_max_reserved: int | None = None
    timed_steps: int = 0
    step_seconds: float = 0.0
    data_seconds: float | None = None
    wait_seconds: float | None = None
    flops: float | None = None
    peak_flops: float | None = None

    @property
    def step(self) -> float | None:
        """Seconds per step; None before a step was timed."""
        return self.step_seconds / self.timed_steps if self.timed_steps else None

    @property
    def data(self) -> float | None:
        """Seconds per step waiting for the data loader."""
        return _per_step(self.data_seconds, self.timed_steps)

    @property
    def wait(self) -> float | None:
        """Seconds per step blocked on collectives (waiting on the other ranks)."""
        return _per_step(self.wait_seconds, self.timed_steps)

    @property
    def compute(self) -> float | None:
        """Seconds per step left once data and collective waits are taken out."""
        step = self.step
        if step is None:
            return None
        return max(step - (self.data or 0.0) - (self.wait or 0.0), 0.0)


def _per_step(total: float | None, steps: int) -> float | None:
    return total / steps if total is not None and steps else None


@dataclass(frozen=True)
class MetricsBatch:
    """Records a rank logged since its last batch, how many it had to drop, and its progress.

    A record sent on its own is a batch of one with ``progress=None`` and ``dropped=None``.
    """

    rank: int
    records: tuple[Record, ...]
    dropped: int | None = 0
    progress: Progress | None = None
    speed: RankSpeed | None = None  # None: this batch says nothing new about speed or memory


@dataclass(frozen=True)
class OutputLine:
    """A whole line a worker printed (without its newline), read from its stdout or stderr."""

    rank: int
    stream: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True)
class Failure:
    """An exception a worker raised, as data: what the kernel turns into a ``WorkerFailure``."""

    exception_type: str
    message: str
    traceback: str
    time: float = field(default_factory=time.monotonic)
    mesh: str = ""  # the rank's device-mesh coordinates, when it built a mesh

    @classmethod
    def from_exception(
        cls,
        error: BaseException | None,
        trace: TracebackType | None,
        hidden: Iterable[str],
        keep_last_frame: bool = True,
    ) -> Failure:
        """The exception, its traceback starting at the first frame outside ``hidden`` files.

        The frames of ``hidden`` files come before the user's code (the worker's own entry);
        ``keep_last_frame`` keeps the raising frame even when it is one of them.

        Example::

            failure = Failure.from_exception(error, error.__traceback__, [__file__])
            failure.on_rank(1)  # the WorkerFailure the kernel shows
        """
        hidden = set(hidden)
        while trace is not None and trace.tb_frame.f_code.co_filename in hidden:
            if keep_last_frame and trace.tb_next is None:
                break
            trace = trace.tb_next
        kind = type(error) if error is not None else Exception
        text = "".join(traceback.format_exception(kind, error, trace))
        qualified = f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins.")
        return cls(qualified, str(error), text)

    def on_rank(self, rank: int) -> WorkerFailure:
        """The failure model the launcher, the pool and the views share."""
        return WorkerFailure(
            rank=rank,
            exit_code=None,
            exception_type=self.exception_type,
            message=self.message,
            traceback=self.traceback,
            time=self.time,
            mesh=self.mesh,
        )


@dataclass(frozen=True)
class Finished:
    """A rank's function ended (how, and when): sent by every rank but the one with the result."""

    ended: str  # "returned", or "called sys.exit(0)"
    time: float


@dataclass(frozen=True)
class Result:
    """Each node's first rank: the function's value and the trained weights of kernel models.

    ``weights`` maps the kernel's ``id`` of a model to its state dict: tensors on the CPU, or
    where rank 0 wrote them in the launch's weights file
    (:class:`~notebook_kit.runtime.weights_file.StoredTensor`).
    """

    value: Any
    weights: dict[int, dict[str, Any]]
    ended: str = "returned"
    time: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class PoolAnswer:
    """A pool worker's answer to one command: ``ok`` with its value, ``error``, or interrupted.

    ``value`` is the encoded value (``{"value": bytes}`` or, when it could not be pickled,
    ``{"repr", "unpicklable"}``), or None when the kernel did not ask for it.
    """

    command: int
    status: str  # "ok", "error" or "interrupted"
    failure: Failure | None = None
    weights: dict[int, dict[str, Any]] = field(default_factory=dict)
    value: dict[str, Any] | None = None
    detail: str | None = None  # what a group check found wrong


@dataclass(frozen=True)
class Stacks:
    """A worker's threads as they are, asked for when a run stalls (the run goes on).

    Each thread is ``{"name", "main", "collective", "stack"}``: the collective it waits in
    (``dist.barrier``, the Stop vote of ``should_stop()``) or None, and its stack as text.
    """

    threads: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class DebuggerPrompt:
    """A rank's pdb waits for a command: what it printed since the last one, and its prompt.

    ``location`` is ``file:line`` of the ``breakpoint()`` it stopped at. The kernel answers
    with a :class:`DebuggerLine` on the rank's answer pipe.
    """

    rank: int
    output: str
    prompt: str
    location: str


@dataclass(frozen=True)
class DebuggerLeft:
    """A rank left pdb (``c`` or ``q``) or skipped its ``breakpoint()``: the lines it had
    printed since its last prompt, or the one line that says which breakpoint it skipped."""

    rank: int
    output: str


@dataclass(frozen=True)
class DebuggerLine:
    """The kernel's answer to a :class:`DebuggerPrompt` (kernel to worker, the other way).

    ``text`` is the line typed; None when nobody can type, so the rank skips its breakpoint,
    saying ``why``. ``interrupted``: the kernel was interrupted at the prompt.
    """

    text: str | None
    interrupted: bool = False
    why: str = ""


@dataclass(frozen=True)
class ProfileOrder:
    """The kernel's order to profile the next ``steps`` steps (0: stop waiting, cancel), the
    traces written in ``folder``; a rank gives up after ``seconds`` without a step clock."""

    number: int
    steps: int
    folder: str
    seconds: float


@dataclass(frozen=True)
class ProfileDone:
    """A rank profiled the steps a :class:`ProfileOrder` asked for (or says why it could not).

    ``table`` rows are ``(operator, calls, self CPU ms, total CPU ms)``, the most self time
    first; ``step_spans`` each step's ``(start, end)`` and ``spans`` the operators run directly
    in a step, ``(name, start, end)``, in ms from the first step's start.
    """

    number: int
    steps: int = 0
    trace: str = ""  # the Chrome trace's path
    table: tuple[tuple[str, int, float, float], ...] = ()
    step_spans: tuple[tuple[float, float], ...] = ()
    spans: tuple[tuple[str, float, float], ...] = ()
    error: str = ""


WorkerMessage = (
    Started
    | MetricsBatch
    | Failure
    | Finished
    | Result
    | PoolAnswer
    | Stacks
    | DebuggerPrompt
    | DebuggerLeft
    | ProfileDone
)
Send = Callable[[WorkerMessage], None]  # a context's way to the kernel


# Every class a worker's frame may hold: the kernel rebuilds none but these.
KINDS = codec.kinds_of(
    Started,
    MetricsBatch,
    Progress,
    RankSpeed,
    Failure,
    Finished,
    Result,
    PoolAnswer,
    Stacks,
    DebuggerPrompt,
    DebuggerLeft,
    ProfileDone,
)
_LINE_KINDS = codec.kinds_of(DebuggerLine)  # the one kind the kernel sends a worker's pdb


def encode(message: WorkerMessage, dumps: codec.Dumps | None = None) -> bytes:
    """``message`` as the bytes a worker's pipe carries (``dumps`` pickles a user's value).

    Example:
        >>> decode(encode(Finished("returned", 1.5)))
        Finished(ended='returned', time=1.5)
    """
    return codec.encode(message, KINDS, dumps=dumps)


def decode(data: bytes) -> WorkerMessage:
    """The message :func:`encode` made of ``data``; raises ``ProtocolError`` for anything else."""
    return codec.decode(data, KINDS)


def encode_line(line: DebuggerLine) -> bytes:
    """``line`` as the bytes a rank's answer pipe carries."""
    return codec.encode(line, _LINE_KINDS)


def decode_line(data: bytes) -> DebuggerLine:
    """The line :func:`encode_line` made of ``data``; raises ``ProtocolError`` for anything else.

    Example:
        >>> decode_line(encode_line(DebuggerLine("p x")))
        DebuggerLine(text='p x', interrupted=False, why='')
    """
    return codec.decode(data, _LINE_KINDS, DebuggerLine)


def weights_of(
    models: Iterable[Any],
    kernel_ids: Mapping[int, int],
    gathered: Mapping[int, dict[str, Any]] | None = None,
) -> dict[int, dict[str, Any]]:
    """State dicts (tensors detached, on the CPU) of the ``models`` the kernel holds.

    ``kernel_ids`` maps a model's ``id`` here to its ``id`` in the kernel: the same object in a
    forked worker (``{i: i}``), or a pool's copy of a model the kernel shipped. ``gathered``
    holds, by ``id`` here, the full state of sharded models (``LaunchContext.gather_weights``):
    their own ``state_dict`` is only this rank's shard.
    """
    import torch  # loaded wherever a model was prepared

    from notebook_kit.runtime.weights_file import home_states

    return {
        kernel_id: {
            key: value.detach().cpu() if isinstance(value, torch.Tensor) else value
            for key, value in state.items()
        }
        for kernel_id, state in home_states(models, kernel_ids, gathered).items()
    }


def plain_values(values: dict[str, Any]) -> dict[str, float]:
    """Numbers only: what cannot become a float is left out rather than failing the send.

    Runs on a worker's metrics sender thread, so nothing may escape it: a value that fails to
    convert, for whatever reason (``10**400`` overflows), is dropped and the rest goes on.
    """
    plain = {}
    for name, value in values.items():
        try:
            plain[str(name)] = float(value.item() if hasattr(value, "item") else value)
        except Exception:  # a sender that raised would stop the live view for good
            continue
    return plain
