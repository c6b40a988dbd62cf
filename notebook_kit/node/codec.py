"""How a cluster run's messages become bytes: plain data, sealed with the run's secret.

Anyone who can reach a Dask scheduler or a Ray cluster can read and post on a run's event
topic, its command topic and its Ray hub. What the kernel or a node takes from there must never
run code, so a frame is:

- **sealed**: an HMAC-SHA256 of the rest under the run's 32-byte secret (:class:`Seal`), which
  the kernel makes for each run and hands each node's worker directly, never through the
  scheduler; the seal is checked (``hmac.compare_digest``) before anything else is read;
- **plain data**: msgpack of a type's name and its fields, rebuilt only into the closed set of
  dataclasses the caller names (tuples come back as tuples, int keys as ints). A value that is
  not plain data (a tensor among a pool's pulled weights) is pickled inside the sealed frame,
  and unpickled only once the seal has been checked.

A frame that fails any of this raises :class:`ProtocolError`: the receiver drops it.

Runs on every side of a cluster run (kernel, node task, node process).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import pickle
import secrets
from collections.abc import Mapping
from typing import Any

import cloudpickle
import msgpack

__all__ = ["MAC_BYTES", "ProtocolError", "Seal", "pack", "unpack"]

MAC_BYTES = 32  # an HMAC-SHA256 digest leads every sealed frame
_SECRET_BYTES = 32
_DATACLASS, _TUPLE, _PICKLED = 1, 2, 3  # msgpack extension codes


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


def pack(message: Any, kinds: Mapping[str, type]) -> bytes:
    """``message`` (a dataclass of ``kinds``, nested ones, builtins) as msgpack: plain data,
    unsealed; what is none of these is pickled."""
    return msgpack.packb(message, default=_Plain(kinds), use_bin_type=True, strict_types=True)


def unpack(data: bytes, kinds: Mapping[str, type]) -> Any:
    """What :func:`pack` made of ``data``, its dataclasses only among ``kinds``.

    Call it only on the inside of a checked seal: a value that was not plain data comes back
    through pickle.
    """
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

    def __init__(self, kinds: Mapping[str, type]) -> None:
        self.kinds = kinds

    def __call__(self, value: Any) -> Any:
        if type(value) is tuple:
            return msgpack.ExtType(_TUPLE, pack(list(value), self.kinds))
        kind = type(value)
        if self.kinds.get(kind.__name__) is kind:
            fields = [getattr(value, f.name) for f in dataclasses.fields(value)]
            return msgpack.ExtType(_DATACLASS, pack([kind.__name__, fields], self.kinds))
        # Anything else (a tensor, a subclass of a builtin, a user's value) keeps its type.
        return msgpack.ExtType(_PICKLED, cloudpickle.dumps(value))


class _Rebuild:
    """msgpack's hook for the extensions :class:`_Plain` made: only the kinds it was given."""

    def __init__(self, kinds: Mapping[str, type]) -> None:
        self.kinds = kinds

    def __call__(self, code: int, data: bytes) -> Any:
        if code == _PICKLED:  # reached only inside a checked seal
            return pickle.loads(data)
        inner = unpack(data, self.kinds)
        if code == _TUPLE and isinstance(inner, list):
            return tuple(inner)
        if code == _DATACLASS and isinstance(inner, list) and len(inner) == 2:
            name, fields = inner
            kind = self.kinds.get(name) if isinstance(name, str) else None
            if kind is None or not isinstance(fields, list):
                raise ProtocolError(f"no message kind {name!r} here")
            return kind(*fields)
        raise ProtocolError(f"unknown extension {code}")
