"""What a pool sends its workers: kernel definitions and values, each copied only when needed.

A pool's workers are forked from the kernel, so their namespace starts as the kernel's. After
that, the kernel keeps a record of which object each name stood for when the workers got it
(``known``) and which names the workers defined themselves (``owned``, from ``%%distributed``
cells). When a cell or a call runs:

- names it uses that the kernel defines, the workers do not own, and whose object changed
  since the workers got it (a function redefined in a cell, a new value) are sent, with the
  names those definitions use in turn;
- an object the workers already hold travels as its name and is looked up there, so data
  loaded before the pool started, or pushed, is never copied again;
- a function defined in a kernel cell is rebuilt on the workers with their namespace as its
  globals (so it sees their names, like a function defined in a ``%%distributed`` cell);
- an array or tensor over ``send_limit`` is refused with a message pointing to ``push``, and
  so is a request that pickles to more than that.
"""

from __future__ import annotations

import dis
import functools
import io
import pickle
import sys
import types
import weakref
from collections.abc import Iterable
from typing import Any

import cloudpickle

from notebook_kit.launch.template_shipping import UnshippableError, fix_for
from notebook_kit.worker.pool.namespace import (
    EMPTY_CELL,
    make_function,
    named,
    set_function_state,
)

__all__ = [
    "DEFAULT_SEND_LIMIT",
    "SendTooLargeError",
    "WorkerHoldings",
    "code_names",
    "hidden_names",
    "names_used_by",
    "stored_names",
]

DEFAULT_SEND_LIMIT = 64 << 20  # bytes: above this, sending to every worker at every call hurts
_LOAD_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"})
_STORE_OPS = frozenset({"STORE_NAME", "DELETE_NAME"})
_GLOBAL_STORE_OPS = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None))


class SendTooLargeError(ValueError):
    """A value a cell or call would copy to every worker is too large to send each time."""


class _Same:
    """The workers hold this very (immutable) value under the name."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class WorkerHoldings:
    """The kernel's record of what the workers hold, and the pickler that uses it.

    Example:
        >>> shipping = WorkerHoldings(sys.modules["__main__"].__dict__); shipping.remember_all()
        >>> shipping.needed({"train"})  # {} until ``train`` is redefined in the kernel
        {}
    """

    def __init__(
        self,
        namespace: dict[str, Any],
        hidden: Iterable[str] = (),
        send_limit: int = DEFAULT_SEND_LIMIT,
    ) -> None:
        self.namespace = namespace
        self.hidden = frozenset(hidden)
        self.send_limit = send_limit
        self.known: dict[str, Any] = {}  # name -> weakref or _Same of what the workers hold
        self.owned: set[str] = set()  # defined on the workers by cells: never sent

    def remember_all(self) -> None:
        """At the fork: the workers hold everything the kernel holds."""
        self.known.clear()
        self.owned.clear()
        for name, value in list(self.namespace.items()):
            if self._is_user_name(name):
                self.remember(name, value)

    def forget_all(self) -> None:
        """At a start on other machines: the workers hold nothing of the kernel's."""
        self.known.clear()
        self.owned.clear()

    def remember(self, name: str, value: Any) -> None:
        """The workers now hold ``value`` under ``name`` (sent or pushed)."""
        self.owned.discard(name)
        identity = _identity(value)
        if identity is None:
            self.known.pop(name, None)
        else:
            self.known[name] = identity

    def mark_owned(self, names: Iterable[str]) -> None:
        """A cell defined these names on the workers: from now on they are the workers'."""
        for name in names:
            self.owned.add(name)
            self.known.pop(name, None)

    def holds(self, name: str, value: Any) -> bool:
        """Whether the workers hold this very object under ``name``."""
        identity = self.known.get(name)
        if isinstance(identity, weakref.ref):
            return identity() is value
        return isinstance(identity, _Same) and identity.value is value

    def needed(self, names: Iterable[str]) -> dict[str, Any]:
        """Kernel definitions and values the workers lack for code using ``names``."""
        shipped: dict[str, Any] = {}
        todo, seen = list(names), set()
        while todo:
            name = todo.pop()
            if name in seen or not self._sendable(name):
                continue
            seen.add(name)
            value = self.namespace[name]
            if not self.holds(name, value):
                shipped[name] = value
            todo.extend(names_used_by(value))  # held or not: what it uses may have changed
        return shipped

    def dumps(
        self, request: dict[str, Any], what: str, *, limit: bool = True, by_name: bool = True
    ) -> bytes:
        """Pickle ``request`` for the workers; ``what`` names the request in errors.

        ``limit=False``: no size limit; ``by_name=False``: everything by value (a push means
        "send this", even an object the workers already hold).
        """
        refs = self._references() if by_name else {}
        send_limit = self.send_limit if limit else None
        buffer = io.BytesIO()
        try:
            _ShippingPickler(buffer, refs, send_limit).dump(request)
        except _TooLarge as large:
            raise SendTooLargeError(self._too_large(what, large.obj, large.size)) from None
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise UnshippableError(_unpicklable(what, request, error)) from error
        data = buffer.getvalue()
        if send_limit is not None and len(data) > send_limit:
            raise SendTooLargeError(self._too_large(what, None, len(data)))
        return data

    def _references(self) -> dict[int, str]:
        refs = {}
        for name, identity in self.known.items():
            if isinstance(identity, weakref.ref):
                value = identity()
                if value is not None and self.namespace.get(name) is value:
                    refs[id(value)] = name
        return refs

    def _too_large(self, what: str, obj: Any, size: int) -> str:
        names = [n for n, v in self.namespace.items() if obj is not None and v is obj]
        if obj is None:
            thing = f"pickles to {_size(size)}"
        else:
            where = f"`{names[0]}`" if names else "a value"
            kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
            thing = f"would copy {where} ({kind}, {_size(size)})"
        hint = (
            f"pool.push({names[0]}={names[0]}) once, then use the name `{names[0]}`: on the "
            f"workers it is found there and nothing is copied"
            if names
            else "push large values once with pool.push(name=value), or create them on the "
            "workers (in a %%distributed cell), and refer to them by name"
        )
        return (
            f"{what} {thing} to every worker, at every call (send_limit is "
            f"{_size(self.send_limit)}). Instead, {hint}."
        )

    def _sendable(self, name: str) -> bool:
        return name in self.namespace and self._is_user_name(name) and name not in self.owned

    def _is_user_name(self, name: str) -> bool:
        return not name.startswith("_") and name not in self.hidden


class _TooLarge(Exception):
    def __init__(self, obj: Any, size: int) -> None:
        super().__init__(size)
        self.obj = obj
        self.size = size


class _ShippingPickler(cloudpickle.Pickler):
    def __init__(self, file: io.BytesIO, refs: dict[int, str], send_limit: int | None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.refs = refs
        self.send_limit = send_limit

    def reducer_override(self, obj: Any) -> Any:
        name = self.refs.get(id(obj))
        if name is not None:
            return named, (name,)
        if isinstance(obj, types.FunctionType) and obj.__module__ == "__main__":
            return _function_reduce(obj)
        if self.send_limit is not None:
            size = _array_bytes(obj)
            if size > self.send_limit:
                raise _TooLarge(obj, size)
        return super().reducer_override(obj)


def _unpicklable(what: str, request: Any, error: Exception) -> str:
    """Which name or argument of ``request`` cannot be pickled, its type, and the fix."""
    shipped = request if isinstance(request, dict) else request[0]
    parts = [(f"`{name}`", value) for name, value in shipped.items()]
    if isinstance(request, tuple):  # pool.run: the function and its arguments come next
        _, args, kwargs = request[1]
        parts += [(f"args[{i}]", value) for i, value in enumerate(args)]
        parts += [(f"the keyword argument {k!r}", value) for k, value in kwargs.items()]
    for where, value in parts:
        try:
            cloudpickle.dumps(value)
        except Exception as failure:
            return (
                f"{what} sends {where} ({type(value).__qualname__}) to the workers, but it "
                f"cannot be pickled: {failure}. {fix_for(value)}"
            )
    return f"{what} cannot be sent to the workers: {error}"


def _function_reduce(function: types.FunctionType) -> tuple[Any, ...]:
    """Rebuild a kernel-cell function on the worker, bound to the worker's namespace."""
    closure = function.__closure__ or ()
    state = {
        "__defaults__": function.__defaults__,
        "__kwdefaults__": function.__kwdefaults__,
        "__qualname__": function.__qualname__,
        "__doc__": function.__doc__,
        "__annotations__": function.__annotations__,
        "__module__": function.__module__,
        "dict": dict(function.__dict__),
        "closure_values": [_cell_value(cell) for cell in closure],
    }
    arguments = (function.__code__, function.__name__, len(closure))
    return make_function, arguments, state, None, None, set_function_state


def _cell_value(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return EMPTY_CELL


def _array_bytes(obj: Any) -> int:
    """Bytes of a tensor's or NumPy array's data (0 for anything else)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if type(obj).__module__ == "numpy" and type(obj).__name__ == "ndarray":
        return int(obj.nbytes)
    return 0


def _identity(value: Any) -> Any:
    """How to recognise ``value`` later without keeping it alive: a weakref, or the value."""
    if isinstance(value, _IMMUTABLE):
        return _Same(value)
    try:
        return weakref.ref(value)
    except TypeError:
        return None  # a list, dict, ...: sent again whenever it is needed


def names_used_by(value: Any) -> set[str]:
    """Global names the code of a kernel-cell function or class refers to."""
    if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
        names = set(code_names(value.__code__))
        for cell in value.__closure__ or ():
            names |= names_used_by(_cell_value(cell))
        return names
    if isinstance(value, type) and value.__module__ == "__main__":
        names = set()
        for klass in value.__mro__:
            if klass.__module__ == "__main__":
                for attribute in vars(klass).values():
                    for function in _functions_in(attribute):
                        names |= names_used_by(function)
        return names
    return set()


def _functions_in(attribute: Any) -> list[Any]:
    if isinstance(attribute, (staticmethod, classmethod)):
        return [attribute.__func__]
    if isinstance(attribute, property):
        return [f for f in (attribute.fget, attribute.fset, attribute.fdel) if f is not None]
    return [attribute] if isinstance(attribute, types.FunctionType) else []


@functools.lru_cache(maxsize=4096)
def code_names(code: types.CodeType) -> frozenset[str]:
    """Global names read by ``code`` and the functions and classes defined in it."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _LOAD_OPS}
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= code_names(constant)
    return frozenset(names)


def stored_names(code: types.CodeType, top: bool = True) -> frozenset[str]:
    """Names a cell's ``code`` binds or deletes in its namespace (``global`` ones too)."""
    operations = _STORE_OPS | _GLOBAL_STORE_OPS if top else _GLOBAL_STORE_OPS
    names = {i.argval for i in dis.get_instructions(code) if i.opname in operations}
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= stored_names(constant, top=False)
    return frozenset(names)


def _size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def hidden_names() -> set[str]:
    """Names IPython puts in the user namespace for itself (``In``, ``Out``, ``exit``...)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return set()
    return set(getattr(shell, "user_ns_hidden", {})) if shell is not None else set()
