"""What a ``log`` call may pass, checked where it is called, and an Accelerator's own history.

``notebook_kit.log`` and ``Accelerator.log`` both go through :func:`check_log_call`, so they
accept and refuse the same things; both then hand the values to the metrics channel
(:mod:`notebook_kit.runtime.metrics`), which never waits for the device.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping, Sequence
from numbers import Integral, Real
from typing import Any

from notebook_kit.runtime.metrics import settle

__all__ = ["LoggedHistory", "check_log_call"]

_HISTORY_RECORDS = 10_000  # what an Accelerator keeps of its own log: the latest records


def check_log_call(values: Any, step: Any) -> tuple[dict[str, Any], int | None]:
    """Check a ``log`` call's values and step; what ``notebook_kit.log`` and ``Accelerator.log``
    both call, so they accept and refuse the same things.

    A bad value is refused here, on the caller's line, naming its key, rather than later on the
    sender thread, where it would stop the live view or fail the run after it returned. Python
    and NumPy numbers come back as floats; tensors stay tensors (reading one would wait for its
    device), checked by shape and dtype alone.

    Returns:
        The values keyed by ``str(name)``, and the step as an int (or None).

    Raises:
        TypeError: ``values`` is not a dict, a value is not a real number or a one-element
            real tensor, or ``step`` is not a non-negative int or None.
        ValueError: A number too large for a float (``10**400``).

    Example:
        >>> import numpy as np
        >>> check_log_call({"loss": np.float32(0.5)}, np.int64(3))
        ({'loss': 0.5}, 3)
    """
    if not isinstance(values, Mapping):
        raise TypeError(
            f"log() takes a dict of metric name to number, got {type(values).__name__}."
        )
    checked = {str(name): _checked_value(str(name), value) for name, value in values.items()}
    if step is not None and (
        isinstance(step, bool) or not isinstance(step, Integral) or int(step) < 0
    ):
        raise TypeError(f"log(step=...) must be a non-negative int or None, got {step!r}.")
    return checked, None if step is None else int(step)


def _checked_value(name: str, value: Any) -> Any:
    kind = type(value)
    if kind is float:  # the common cases first: this runs at every step
        return value
    if kind is not bool and hasattr(value, "numel") and hasattr(value, "dtype"):  # a tensor
        if value.numel() != 1:
            raise TypeError(f"{_refusal(name, value)} with {value.numel()} elements: log one.")
        if value.dtype.is_complex or value.device.type == "meta":
            raise TypeError(
                f"{_refusal(name, value)} of {value.dtype} on {value.device}: not a real number."
            )
        return value
    if isinstance(value, bool):
        raise TypeError(f"{_refusal(name, value)}: log it as 0 or 1.")
    if not isinstance(value, Real):
        if not (hasattr(value, "item") and getattr(value, "size", None) == 1):  # NumPy
            raise TypeError(f"{_refusal(name, value)}.")
        number = value.item()
        if isinstance(number, bool) or not isinstance(number, Real):
            raise TypeError(
                f"{_refusal(name, value)} holding {type(number).__name__}: not a real number."
            )
        value = number
    try:
        return float(value)
    except (OverflowError, ValueError) as error:
        raise ValueError(
            f"log(): {name!r} cannot be stored as a float ({error}); log a smaller number, "
            "for example its logarithm."
        ) from error


def _refusal(name: str, value: Any) -> str:
    return f"log() takes numbers or one-element tensors; {name!r} is {type(value).__name__}"


class LoggedHistory(Sequence[dict[str, Any]]):
    """An Accelerator's own record of what it logged: the latest records, read when looked at.

    Bounded, so a long run does not keep every value in the worker; values are stored as their
    snapshots and become floats only when read, so logging a GPU tensor never waits for it.
    Each record reads as ``{"step": step, "values": {name: float}}``.

    Example:
        >>> history = LoggedHistory(); history.append(3, {"loss": 0.5})
        >>> history[-1]
        {'step': 3, 'values': {'loss': 0.5}}
    """

    def __init__(self, capacity: int = _HISTORY_RECORDS) -> None:
        self._records: collections.deque[tuple[int | None, dict[str, Any]]] = collections.deque(
            maxlen=capacity
        )

    @property
    def capacity(self) -> int:
        return self._records.maxlen or 0

    def append(self, step: int | None, snapshots: dict[str, Any]) -> None:
        self._records.append((step, snapshots))

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._read(record) for record in list(self._records)[index]]
        return self._read(self._records[index])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self._read(record) for record in list(self._records))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LoggedHistory, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))

    @staticmethod
    def _read(record: tuple[int | None, dict[str, Any]]) -> dict[str, Any]:
        step, snapshots = record
        return {"step": step, "values": settle(snapshots)}
