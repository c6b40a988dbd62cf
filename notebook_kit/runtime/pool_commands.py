"""What a pool's kernel asks of its workers, as typed data: one frozen dataclass per command.

``WorkerPool`` makes one command per call; its backend adds the group check and the close,
and sends each as a :class:`PoolRequest` on a local worker's command pipe, or inside a
cluster's ``RunCommand`` to every node, which sends it on to its ranks the same way. Both ends
use the one codec (:mod:`notebook_kit.runtime.codec`): plain data, except
the user's own objects, which the kernel cloudpickles into ``payload`` bytes that only a worker
opens.

Lives in ``runtime`` because the kernel, a node process and the workers all import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from notebook_kit.runtime import codec

__all__ = [
    "CHECK_SECONDS",
    "KINDS",
    "PoolCall",
    "PoolCell",
    "PoolCheck",
    "PoolClose",
    "PoolCommand",
    "PoolDebug",
    "PoolPull",
    "PoolPush",
    "PoolRequest",
    "ReloadOrder",
    "ShippedSource",
    "decode",
    "encode",
]


CHECK_SECONDS = 0.4  # the bound of the all-reduce that checks the group after a fault


@dataclass(frozen=True)
class ShippedSource:
    """A user module's edited file, as the kernel read it: a cluster rank reloads ``module``
    from this text (its own copy of the file may be old or absent)."""

    module: str
    source: str


@dataclass(frozen=True)
class ReloadOrder:
    """Before running the command, reload the user modules whose file changed (mtime) since
    they were loaded, and those of ``shipped`` from the kernel's text."""

    shipped: tuple[ShippedSource, ...] = ()


@dataclass(frozen=True)
class PoolCell:
    """Run ``source`` (``filename`` names it in tracebacks) in the namespace; ``payload``:
    the kernel's globals it uses, pickled."""

    source: str
    filename: str
    payload: bytes
    reload: ReloadOrder | None = None  # None: run on the code the workers hold


@dataclass(frozen=True)
class PoolPull:
    """Send back the value of ``name``."""

    name: str


@dataclass(frozen=True)
class PoolCall:
    """Call a function: ``payload`` pickles ``(shipped, (function, args, kwargs), home)``,
    together, so that the kernel's models among the arguments stay the ``home`` ones."""

    payload: bytes
    weights_fd: int | None  # the kernel's weights file, inherited at the fork (local only)
    reload: ReloadOrder | None = None


@dataclass(frozen=True)
class PoolPush:
    """Define names on the worker: ``payload`` pickles ``{name: value}``."""

    payload: bytes
    reload: ReloadOrder | None = None


@dataclass(frozen=True)
class PoolCheck:
    """After a fault: do all ranks still meet in a collective within :data:`CHECK_SECONDS`?"""


@dataclass(frozen=True)
class PoolDebug:
    """Open pdb on the traceback of this rank's last failed command (kept until the next
    command), at the kernel's prompt; answered when the user leaves it."""


@dataclass(frozen=True)
class PoolClose:
    """Leave the process group and exit."""


PoolCommand = PoolCell | PoolCall | PoolPush | PoolPull | PoolCheck | PoolDebug | PoolClose


@dataclass(frozen=True)
class PoolRequest:
    """One command on a worker's pipe: its ``number`` (answers and interrupts name it) and
    whether the kernel wants this rank's value."""

    number: int
    want_value: bool
    command: PoolCommand


KINDS = codec.kinds_of(
    ShippedSource,
    ReloadOrder,
    PoolCell,
    PoolCall,
    PoolPush,
    PoolPull,
    PoolCheck,
    PoolDebug,
    PoolClose,
    PoolRequest,
)


def encode(request: PoolRequest) -> bytes:
    """A request as the bytes a worker's command pipe carries (private to the kernel: no seal)."""
    return codec.encode(request, KINDS)


def decode(data: bytes) -> PoolRequest:
    """What :func:`encode` made: a :class:`PoolRequest`, or :class:`codec.ProtocolError`."""
    return codec.decode(data, KINDS, PoolRequest)
