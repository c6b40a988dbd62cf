"""Trained weights come home: rank 0's parameters are loaded into the kernel's own models.

Workers are forked, so a model object the kernel holds has the same ``id`` in every worker.
Before forking, the launcher lists the kernel's models the function can reach; rank 0 sends
back the state of those it prepared, and the kernel loads it into the very same objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

__all__ = ["find_kernel_models", "load_home_weights"]

_SEARCH_DEPTH = 3


def find_kernel_models(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[int, nn.Module]:
    """Models reachable from the arguments, the closure and the function's globals."""
    found: dict[int, nn.Module] = {}
    roots: list[Any] = [*args, *kwargs.values()]
    closure = getattr(function, "__closure__", None) or ()
    for cell in closure:
        try:
            roots.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    roots += [
        value
        for value in getattr(function, "__globals__", {}).values()
        if isinstance(value, nn.Module)
    ]
    _collect(roots, found, _SEARCH_DEPTH)
    return found


def _collect(objects: Iterable[Any], found: dict[int, nn.Module], depth: int) -> None:
    for obj in objects:
        if isinstance(obj, nn.Module):
            found[id(obj)] = obj
        elif depth > 0 and isinstance(obj, (list, tuple, set, frozenset)):
            _collect(obj, found, depth - 1)
        elif depth > 0 and isinstance(obj, dict):
            _collect(obj.values(), found, depth - 1)


def load_home_weights(models: dict[int, nn.Module], weights: dict[int, dict[str, Any]]) -> None:
    """Load each returned state dict into the kernel model it was trained from."""
    for model_id, state in weights.items():
        model = models.get(model_id)
        if model is not None:
            model.load_state_dict(state)
