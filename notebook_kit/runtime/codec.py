"""How every message between processes becomes bytes: plain data, sealed where it must be.

One encoder and one decoder (:func:`encode`, :func:`decode`) for all of them: a worker's
messages to the kernel and a zygote's requests (unsealed: a private pipe or socket between a
process and the one it forked), a cluster's events and orders, a pool's commands. Each side
names the closed set of dataclasses it expects (:func:`kinds_of`).

On a cluster, anyone who can reach a Dask scheduler or a Ray cluster can read and post on a
run's event topic, its command topic and its Ray hub. What the kernel or a node takes from
there must never run code, so a frame is:

- **sealed**: an HMAC-SHA256 of the rest under the run's 32-byte secret (:class:`Seal`), which
  the kernel makes for each run and hands each node's worker directly, never through the
  scheduler; the seal is checked (``hmac.compare_digest``) before anything else is read;
- **plain data**: msgpack of a type's name and its fields, rebuilt only into the closed set of
  dataclasses the caller names (tuples come back as tuples, int keys as ints). A value that is
  not plain data (a tensor among a pool's pulled weights) is pickled inside the sealed frame,
  and unpickled only once the seal has been checked.

A frame that fails any of this raises :class:`ProtocolError`: the receiver drops it.

Runs in every process (kernel, worker, node task, node process), hence ``runtime``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import pickle
import secrets
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import cloudpickle
import msgpack

__all__ = ["MAC_BYTES", "ProtocolError", "Seal", "decode", "encode", "kinds_of"]

MAC_BYTES = 32  # an HMAC-SHA256 digest leads every sealed frame
_SECRET_BYTES = 32
_DATACLASS, _TUPLE, _PICKLED = 1, 2, 3  # msgpack extension codes
T = TypeVar("T")
Dumps = Callable[[Any], bytes]


class ProtocolError(RuntimeError):
    """A frame that is not a sealed message of a kind expected where it arrived: forged,
    damaged, or from another run or version."""


class Seal:
    """One run's secret: seals each frame it sends and checks each frame it receives.

    Example:
        >>> seal = Seal.new()
        >>> seal.open(seal.close(b"data"))
        b'data'
    """

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes) or len(secret) < _SECRET_BYTES:
            raise ValueError(f"a run's secret is {_SECRET_BYTES} random bytes")
        self.secret = secret

    @classmethod
    def new(cls) -> Seal:
        """A fresh secret, for one run."""
        return cls(secrets.token_bytes(_SECRET_BYTES))

    def _mac(self, data: bytes) -> bytes:
        return hmac.new(self.secret, data, hashlib.sha256).digest()

    def close(self, data: bytes) -> bytes:
        """``data`` behind its seal."""
        return self._mac(data) + data

    def open(self, frame: bytes) -> bytes:
        """What ``frame`` seals; raises :class:`ProtocolError` unless this secret sealed it."""
        if not isinstance(frame, bytes | bytearray | memoryview):
            raise ProtocolError(f"a frame is bytes, not {type(frame).__name__}")
        frame = bytes(frame)
        mac, data = frame[:MAC_BYTES], frame[MAC_BYTES:]
        if len(mac) < MAC_BYTES or not hmac.compare_digest(mac, self._mac(data)):
            raise ProtocolError("its seal does not match this run's secret")
        return data


def kinds_of(*classes: type) -> dict[str, type]:
    """The registry :func:`encode` and :func:`decode` take: each dataclass by its name."""
    return {kind.__name__: kind for kind in classes}


def encode(
    message: Any, kinds: Mapping[str, type], seal: Seal | None = None, dumps: Dumps | None = None
) -> bytes:
    """``message`` (a dataclass of ``kinds``, nested ones, builtins) as msgpack, behind ``seal``
    when one is given; what is none of these is pickled (by ``dumps``, default cloudpickle: a
    worker passes one that brings device tensors to the CPU)."""
    plain = _Plain(kinds, dumps or cloudpickle.dumps)
    data = msgpack.packb(message, default=plain, use_bin_type=True, strict_types=True)
    return data if seal is None else seal.close(data)


def decode(
    data: bytes, kinds: Mapping[str, type], *expected: type[T], seal: Seal | None = None
) -> T:
    """The message ``data`` holds, checked against ``seal`` first (when given) and then to be
    one of ``expected`` (any kind of ``kinds`` when none is named).

    Raises:
        ProtocolError: anything else (a forgery, another run's frame, damaged bytes).
    """
    message = _unpack(data if seal is None else seal.open(data), kinds)
    if expected and not isinstance(message, expected):
        names = ", ".join(kind.__name__ for kind in expected)
        raise ProtocolError(f"expected {names}, got {type(message).__name__}")
    return message


def _unpack(data: bytes, kinds: Mapping[str, type]) -> Any:
    """What :func:`encode` made of ``data`` (unsealed): call it only inside a checked seal, as
    a value that was not plain data comes back through pickle."""
    try:
        return msgpack.unpackb(
            data, ext_hook=_Rebuild(kinds), raw=False, strict_map_key=False, use_list=True
        )
    except ProtocolError:
        raise
    except Exception as error:  # truncated, not msgpack, fields that do not fit: not ours
        raise ProtocolError(f"not a message of this protocol ({error})") from None


class _Plain:
    """msgpack's hook for what it does not pack itself (``strict_types``: exact types only)."""

    def __init__(self, kinds: Mapping[str, type], dumps: Dumps) -> None:
        self.kinds = kinds
        self.dumps = dumps

    def __call__(self, value: Any) -> Any:
        if type(value) is tuple:
            return msgpack.ExtType(_TUPLE, self._packed(list(value)))
        kind = type(value)
        if self.kinds.get(kind.__name__) is kind:
            fields = [
                getattr(value, name) if out is None else out(getattr(value, name))
                for name, out, _ in _shape(kind)
            ]
            return msgpack.ExtType(_DATACLASS, self._packed([kind.__name__, fields]))
        # Anything else (a tensor, a subclass of a builtin, a user's value) keeps its type.
        return msgpack.ExtType(_PICKLED, self.dumps(value))

    def _packed(self, value: Any) -> bytes:
        return msgpack.packb(value, default=self, use_bin_type=True, strict_types=True)


class _Rebuild:
    """msgpack's hook for the extensions :class:`_Plain` made: only the kinds it was given."""

    def __init__(self, kinds: Mapping[str, type]) -> None:
        self.kinds = kinds

    def __call__(self, code: int, data: bytes) -> Any:
        if code == _PICKLED:  # reached only inside a checked seal
            return pickle.loads(data)
        inner = _unpack(data, self.kinds)
        if code == _TUPLE and isinstance(inner, list):
            return tuple(inner)
        if code == _DATACLASS and isinstance(inner, list) and len(inner) == 2:
            name, fields = inner
            kind = self.kinds.get(name) if isinstance(name, str) else None
            if kind is None or not isinstance(fields, list):
                raise ProtocolError(f"no message kind {name!r} here")
            shape = _shape(kind)
            if len(fields) > len(shape):
                raise ProtocolError(
                    f"not a message of this protocol ({name} has {len(shape)} fields)"
                )
            # An older sender's fewer fields: the rest take their defaults.
            pairs = zip(fields, shape, strict=False)
            return kind(*[v if back is None else back(v) for v, (*_, back) in pairs])
        raise ProtocolError(f"unknown extension {code}")


Convert = Callable[[Any], Any]


@functools.cache
def _shape(kind: type) -> tuple[tuple[str, Convert | None, Convert | None], ...]:
    """Each field of a message class: its name, and how the tuples its annotation declares
    travel as plain arrays (to lists, back to tuples); None where it declares none.

    A record batch holds thousands of tuples: tagging each one (as a tuple the annotations do
    not declare is tagged) would cost ten times what pickle did.
    """
    try:
        hints = typing.get_type_hints(kind)
    except Exception:  # an annotation not resolvable here: its tuples travel tagged
        hints = {}
    return tuple(
        (field.name, _arrays(hints.get(field.name), list), _arrays(hints.get(field.name), tuple))
        for field in dataclasses.fields(kind)
    )


def _arrays(hint: Any, make: type) -> Convert | None:
    """What turns each tuple ``hint`` declares (at any depth) into ``make``; None: nothing."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _arrays(args[0], make)
        return make if item is None else lambda value: make(map(item, value))
    if origin is tuple:
        items = [_arrays(arg, make) for arg in args]
        if not any(items):
            return make
        return lambda value: make(
            v if f is None else f(v) for f, v in zip(items, value, strict=True)
        )
    if origin in (typing.Union, types.UnionType):
        options = [f for arg in args if (f := _arrays(arg, make)) is not None]
        if len(options) == 1:  # ``tuple[...] | None``: the tuple when there is one
            (only,) = options
            return lambda value: only(value) if isinstance(value, list | tuple) else value
    return None
