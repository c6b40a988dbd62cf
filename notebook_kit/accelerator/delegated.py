"""Attributes an object shows under Accelerate's names but keeps in one of its parts."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

__all__ = ["Delegated"]

T = TypeVar("T")


class Delegated(Generic[T]):
    """A read-only attribute read from a part of the object, so the part is the one place the
    value lives (``accelerator.device`` is ``accelerator.state.device``).

    Example:
        >>> import types
        >>> class Run:
        ...     rank = Delegated[int]("state")
        ...     steps = Delegated[int]("state", "num_steps")
        ...     def __init__(self):
        ...         self.state = types.SimpleNamespace(rank=3, num_steps=2)
        >>> Run().rank, Run().steps
        (3, 2)
    """

    def __init__(self, part: str, name: str | None = None, doc: str | None = None) -> None:
        self.part, self.name, self.__doc__ = part, name, doc

    def __set_name__(self, owner: type, attribute: str) -> None:
        self.name = self.name or attribute

    def __get__(self, instance: Any, owner: type | None = None) -> T:
        if instance is None:  # looked up on the class (help(), documentation tools)
            return self  # type: ignore[return-value]
        return getattr(getattr(instance, self.part), self.name)  # type: ignore[arg-type]

    def __set__(self, instance: Any, value: Any) -> None:
        # A data descriptor, as a property is: an instance attribute never hides it.
        raise AttributeError(f"{self.name} is read-only (it is {self.part}.{self.name})")
