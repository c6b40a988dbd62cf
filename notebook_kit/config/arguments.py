"""Validation of launch arguments: every mistake is reported before a process starts."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

MixedPrecision = Literal["no", "fp16", "bf16"]
Backend = Literal["gloo", "nccl"]

MIXED_PRECISION_CHOICES: tuple[str, ...] = ("no", "fp16", "bf16")
BACKEND_CHOICES: tuple[str, ...] = ("gloo", "nccl")


def check_int(name: str, value: Any, *, minimum: int, maximum: int | None = None) -> int:
    """Return ``value`` if it is an int in range, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})."
        )
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise ValueError(f"{name} must be >= {minimum}{upper}, got {value}.")
    return value


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is True or False, else raise naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return value


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise naming ``name``."""
    if value not in choices:
        allowed = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"{name} must be one of {allowed} (or None), got {value!r}.")
    return value


def check_function(function: Any) -> Callable[..., Any]:
    if not callable(function):
        raise TypeError(f"function must be callable, got {type(function).__name__}.")
    return function


def check_args(args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Normalise ``args``/``kwargs``, rejecting the common mistake of a bare argument."""
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError(
            f"args must be a tuple of positional arguments, got {type(args).__name__}; "
            "for a single argument write args=(value,)."
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict of keyword arguments, got {type(kwargs).__name__}.")
    return tuple(args), dict(kwargs)


def check_timeout(timeout: Any, name: str = "timeout") -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {timeout!r}.")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {timeout}.")
    return float(timeout)


def check_master_addr(master_addr: Any) -> str:
    if not isinstance(master_addr, str) or not master_addr.strip():
        raise ValueError(
            f"master_addr must be a host name or IP address such as '127.0.0.1', "
            f"got {master_addr!r}."
        )
    return master_addr.strip()


def check_node_rank(num_nodes: int, node_rank: int) -> None:
    """Both already checked as integers: node_rank must name one of the nodes."""
    if node_rank >= num_nodes:
        raise ValueError(
            f"node_rank must be in 0..{num_nodes - 1} (num_nodes={num_nodes}), got {node_rank}."
        )
