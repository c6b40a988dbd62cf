"""Accelerate's ``notebook_launcher`` rendezvous arguments, translated to this launcher's options.

Accelerate starts workers through torch elastic; these arguments configure its rendezvous and
its agent. Here every rank meets at one TCP store on node 0 (what torch calls the c10d store)
with a fixed set of ranks, so:

- ``rdzv_backend``: ``"static"`` and ``"c10d"`` both mean that rendezvous; others are refused.
- ``rdzv_endpoint="host:port"``: where node 0's store listens, i.e. ``master_addr`` (more than
  one node) and ``use_port``.
- ``rdzv_conf``: its ``"timeout"``/``"join_timeout"`` becomes ``rendezvous_timeout``; other keys
  tune elastic membership, which does not exist here, and are refused.
- ``rdzv_id``: has no effect (each launch has a rendezvous of its own); a warning says so.
- ``monitor_interval``: has no effect: a failed worker is seen the moment it fails, not at the
  next poll.
- ``log_line_prefix_template``: has no effect (a warning says so): each rank's output is shown
  apart (its own tab in a notebook, a rank label in a terminal).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["RENDEZVOUS_OPTIONS", "translate_rendezvous_options"]

RENDEZVOUS_OPTIONS = (
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_conf",
    "rdzv_id",
    "monitor_interval",
    "log_line_prefix_template",
)
_TIMEOUT_KEYS = ("timeout", "join_timeout")
_NO_EFFECT = {
    "rdzv_id": "each launch has a rendezvous of its own.",
    "log_line_prefix_template": "each rank's output is shown apart, labelled with its rank.",
}


def _endpoint(endpoint: Any) -> tuple[str | None, int | None]:
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise ValueError(f"rdzv_endpoint must be 'host:port' or 'host', got {endpoint!r}.")
    host, _, port = endpoint.strip().rpartition(":") if ":" in endpoint else (endpoint, "", "")
    if port and not port.isdigit():
        raise ValueError(f"rdzv_endpoint {endpoint!r} has a port that is not a number.")
    return host.strip() or None, int(port) if port else None


def _conflict(options: dict[str, Any], name: str, value: Any, source: str) -> None:
    given = options.get(name)
    if given is not None and value is not None and given != value:
        raise ValueError(f"{source} gives {name}={value!r}, but {name}={given!r} was also passed.")
    if value is not None:
        options[name] = value


def _conf_timeout(conf: Any) -> float | None:
    if not isinstance(conf, Mapping):
        raise TypeError(f"rdzv_conf must be a dict, got {type(conf).__name__}.")
    unknown = sorted(set(conf) - set(_TIMEOUT_KEYS))
    if unknown:
        raise ValueError(
            f"rdzv_conf keys {unknown} tune torch elastic's membership, which this launcher does "
            f"not use (a fixed set of ranks); only 'timeout'/'join_timeout' apply."
        )
    values = [float(conf[key]) for key in _TIMEOUT_KEYS if key in conf]
    return max(values) if values else None


def translate_rendezvous_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the rendezvous arguments replaced by this launcher's own.

    Example:
        >>> translate_rendezvous_options({"rdzv_endpoint": "10.0.0.1:29500", "num_nodes": 2})
        {'num_nodes': 2, 'master_addr': '10.0.0.1', 'use_port': 29500}
    """
    result = {k: v for k, v in options.items() if k not in RENDEZVOUS_OPTIONS}
    backend = options.get("rdzv_backend")
    if backend is not None and backend not in ("static", "c10d"):
        raise ValueError(
            f"rdzv_backend must be 'static' or 'c10d' (the ranks meet at a TCP store on node 0), "
            f"got {backend!r}."
        )
    if options.get("rdzv_endpoint") is not None:
        host, port = _endpoint(options["rdzv_endpoint"])
        if (options.get("num_nodes") or 1) > 1:  # one node always meets on loopback
            _conflict(result, "master_addr", host, "rdzv_endpoint")
        _conflict(result, "use_port", port, "rdzv_endpoint")
    if options.get("rdzv_conf") is not None:
        timeout = _conf_timeout(options["rdzv_conf"])
        if timeout is not None:
            result["rendezvous_timeout"] = timeout
    interval = options.get("monitor_interval")
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0
    ):
        raise ValueError(
            f"monitor_interval must be a positive number of seconds, got {interval!r}."
        )
    for name, why in _NO_EFFECT.items():
        if options.get(name) is not None:
            warnings.warn(f"notebook_launcher({name}=...) has no effect here: {why}", stacklevel=4)
    return result
