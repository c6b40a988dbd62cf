"""A pool worker's namespace: where cells run, how kernel definitions and values land in it.

A pool worker is forked from the kernel, so its ``__main__`` namespace starts as a copy of the
kernel's as it was when the pool started; cells and calls run in it, and what they define stays
for the next one. What the kernel sends later arrives pickled (cloudpickle), with two twists
decided by the kernel's pickler (``launch/pool/shipping.py``) and undone here:

- an object the workers already hold (inherited at the fork, pushed, or sent before) travels as
  its name and is looked up here (:func:`named`), so it is never copied again;
- a function defined in a kernel cell is rebuilt with this namespace as its globals
  (:func:`make_function`), so the names it uses are the workers' own, like a function defined
  in a ``%%distributed`` cell.
"""

from __future__ import annotations

import ast
import linecache
import sys
import types
from typing import Any

__all__ = [
    "EMPTY_CELL",
    "make_function",
    "named",
    "namespace",
    "run_cell",
    "set_function_state",
]


def namespace() -> dict[str, Any]:
    """The namespace cells run in: this process's ``__main__`` (the kernel's, as forked).

    Example:
        >>> namespace()["__name__"]
        '__main__'
    """
    return sys.modules["__main__"].__dict__


def named(name: str) -> Any:
    """The workers' value of ``name``: what an object the workers already hold unpickles to.

    Example:
        >>> named("__name__")
        '__main__'
    """
    space = namespace()
    if name not in space:
        raise NameError(
            f"name {name!r} is not defined on this worker any more (a %%distributed cell "
            f"deleted it?); push it again with pool.push({name}=...)."
        )
    return space[name]


def make_function(code: types.CodeType, name: str, cells: int) -> types.FunctionType:
    """A function for ``code`` whose globals are this worker's namespace (state comes later).

    The closure's cells start empty and are filled by :func:`set_function_state`, so a
    function that refers to itself through its closure unpickles too.
    """
    closure = tuple(types.CellType() for _ in range(cells)) or None
    return types.FunctionType(code, namespace(), name, None, closure)


def set_function_state(function: types.FunctionType, state: dict[str, Any]) -> None:
    """Defaults, closure values and attributes of a function built by :func:`make_function`."""
    for cell, value in zip(function.__closure__ or (), state.pop("closure_values"), strict=True):
        if value is not EMPTY_CELL:
            cell.cell_contents = value
    function.__dict__.update(state.pop("dict"))
    for attribute, value in state.items():
        setattr(function, attribute, value)


class _EmptyCell:
    """Stands for a closure cell with no value yet (a name assigned after the function)."""

    def __reduce__(self) -> str:
        return "EMPTY_CELL"


EMPTY_CELL = _EmptyCell()


def run_cell(source: str, filename: str) -> Any:
    """Run a cell's code in the namespace; the value of its last expression, like IPython.

    The source is registered with ``linecache``, so tracebacks show the cell's lines.

    Example:
        >>> run_cell("x = 2\\nx * 21", "<cell>")
        42
    """
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    space = namespace()
    exec(compile(tree, filename, "exec"), space)
    if last is None:
        return None
    return eval(compile(last, filename, "eval"), space)
