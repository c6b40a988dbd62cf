"""Trained weights come home: rank 0's parameters are loaded into the kernel's own models.

Workers are forked, so a model object the kernel holds has the same ``id`` in every worker.
Before forking, the launcher lists the kernel's models the function can reach; rank 0 sends
back the state of those it prepared, and the kernel loads it into the very same objects. The
state comes through a file in shared memory, tensor by tensor
(:mod:`notebook_kit.runtime.weights_file`), so the kernel never holds a second copy of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from notebook_kit.runtime.weights_file import load_states

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


def load_home_weights(
    models: dict[int, nn.Module],
    weights: dict[int, dict[str, Any]],
    weights_fd: int | None = None,
) -> None:
    """Load each returned state dict into the kernel model it was trained from.

    ``weights`` holds tensors, or where rank 0 wrote them in the weights file ``weights_fd``
    (:mod:`notebook_kit.runtime.weights_file`): those are copied from the mapped file straight
    into the model's own tensors, so loading adds at most one model's size to the kernel.
    """
    wanted = {model_id: state for model_id, state in weights.items() if model_id in models}

    def load(model_id: int, state: dict[str, Any], release: Callable[[], None]) -> None:
        model = models[model_id]
        # Before each submodule loads, the file's pages the ones before it copied leave the
        # kernel's memory: loading adds about one submodule's size, not the model's.
        hooks = [_before_load(module, release) for module in model.modules()]
        try:
            model.load_state_dict(state)
        finally:
            for hook in hooks:
                hook.remove()

    load_states(weights_fd, wanted, load)


def _before_load(module: nn.Module, call: Callable[[], None]) -> Any:
    """Run ``call`` before ``module`` loads its own tensors from a state dict."""
    register = getattr(module, "register_load_state_dict_pre_hook", None)
    if register is not None:  # torch >= 2.5
        return register(lambda *_: call())
    return module._register_load_state_dict_pre_hook(lambda *_: call(), with_module=True)
