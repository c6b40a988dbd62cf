"""Validation of launch arguments: every mistake is reported before a process starts."""

from __future__ import annotations

import functools
import inspect
import ipaddress
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, ParamSpec, TypeVar

MixedPrecision = Literal["no", "fp16", "bf16"]
Backend = Literal["gloo", "nccl"]
# How a launch's workers start (launch/template_choice.py): "auto" forks the kernel when that is
# safe, else starts them from its clean template process; the other two always do one of them.
StartMethod = Literal["auto", "fork", "template"]

MIXED_PRECISION_CHOICES: tuple[str, ...] = ("no", "fp16", "bf16")
BACKEND_CHOICES: tuple[str, ...] = ("gloo", "nccl")
START_METHOD_CHOICES: tuple[str, ...] = ("auto", "fork", "template")

_Parameters = ParamSpec("_Parameters")
_Result = TypeVar("_Result")


def takes_arguments_of(
    signature: Callable[_Parameters, Any],
) -> Callable[[Callable[..., _Result]], Callable[_Parameters, _Result]]:
    """Give the decorated body ``signature``'s parameters, and the call's arguments as one dict.

    The settings are written out once, in ``signature`` (for ``help()``, type checkers and
    ``tests/test_schema.py``); the body gets them bound, defaults filled in: ``body(options)``,
    or ``body(self, options)`` for a method. An ``async def`` body stays awaitable.

    Example:
        >>> def keywords(a: int = 1, *, b: int = 2) -> None: ...
        >>> takes_arguments_of(keywords)(lambda options: options)(b=3)
        {'a': 1, 'b': 3}
    """
    parameters = inspect.signature(signature)
    method = next(iter(parameters.parameters), None) == "self"

    def decorate(body: Callable[..., _Result]) -> Callable[_Parameters, _Result]:
        def bind(args: Any, kwargs: Any) -> list[Any]:
            try:
                bound = parameters.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{body.__qualname__}() {error}") from None
            bound.apply_defaults()
            options = dict(bound.arguments)
            return [options.pop("self"), options] if method else [options]

        @functools.wraps(body)
        def call(*args: Any, **kwargs: Any) -> Any:
            return body(*bind(args, kwargs))

        @functools.wraps(body)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            return await body(*bind(args, kwargs))  # type: ignore[misc]

        wrapper: Any = call_async if inspect.iscoroutinefunction(body) else call
        wrapper.__signature__ = parameters
        wrapper.__annotations__ = signature.__annotations__
        return wrapper

    return decorate


def check_int(name: str, value: Any, *, minimum: int, maximum: int | None = None) -> int:
    """Return ``value`` if it is an int in range, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})."
        )
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be >= {minimum} and <= {maximum}, got {value}.")
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


_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def is_loopback(address: str) -> bool:
    """Whether ``address`` reaches only this machine: 127.0.0.0/8, ::1 or ``localhost``.

    Names are not resolved (that can block on DNS); a host name that maps to 127.0.1.1 in
    ``/etc/hosts`` is not recognised.

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("10.0.0.1")
        (True, False)
    """
    name = address.strip().lower().removeprefix("[").removesuffix("]")
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def loopback_master_problem(
    num_nodes: int, master_addr: str, origin: str, *, cli: bool = False
) -> str | None:
    """Why a launch on several nodes cannot use ``master_addr`` (None when it can).

    An address only this machine reaches, taken from a default rather than given, is almost
    always a forgotten setting: the other nodes would wait for node 0 until the rendezvous
    timeout. ``origin`` says where the value came from, e.g. ``"the default"``.
    """
    if num_nodes <= 1 or not is_loopback(master_addr):
        return None
    if cli:
        example, explicit = "--master-addr 10.0.0.1", f"give --master-addr {master_addr}"
    else:
        example = f'notebook_launcher(..., num_nodes={num_nodes}, master_addr="10.0.0.1")'
        explicit = f'pass master_addr="{master_addr}"'
    return (
        f"master_addr is {master_addr!r} ({origin}), which only this machine can reach, but "
        f"num_nodes={num_nodes}: the other nodes could not join, and would wait for node 0 "
        "until the rendezvous timeout. Set master_addr to node 0's address on the network "
        f"that every node can reach, e.g. {example} (`hostname -I` on node 0 lists its "
        f"addresses). To run every node on this one machine, as a test, {explicit} explicitly."
    )


def check_node_rank(num_nodes: int, node_rank: int) -> None:
    """Both already checked as integers: node_rank must name one of the nodes."""
    if node_rank >= num_nodes:
        raise ValueError(
            f"node_rank must be in 0..{num_nodes - 1} (num_nodes={num_nodes}), got {node_rank}."
        )
