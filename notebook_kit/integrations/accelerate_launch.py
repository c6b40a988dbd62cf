"""Hugging Face Accelerate's own ``Accelerator`` inside a launch: fresh state, weights home.

Applied by :mod:`notebook_kit.integrations.activation` once the Accelerate modules are
imported in a launched process; nothing here imports ``accelerate`` itself.

Accelerate keeps its process state in class-level dictionaries: a state made in the kernel
before the fork (one process) would be inherited by every worker, which would each train alone.
Prepared models are told to the launch so rank 0's weights come home to the kernel's objects.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from notebook_kit.integrations.post_import import Undo
from notebook_kit.runtime.context import LaunchContext, current_launch

__all__ = ["clear_stale_state", "register_prepared_models"]


def clear_stale_state(state_module: ModuleType, context: LaunchContext) -> None:
    """Forget an Accelerate process state that belongs to another process or launch.

    Example::

        clear_stale_state(accelerate.state, current_launch())
    """
    shared = state_module.PartialState._shared_state
    if not shared:
        return
    place = (shared.get("num_processes"), shared.get("process_index"))
    if place == (context.world_size, context.rank):
        return
    state_module.AcceleratorState._reset_state(reset_partial_state=True)
    state_module.GradientState._reset_state()


def register_prepared_models(accelerator_module: ModuleType) -> Undo:
    """Wrap ``Accelerator.prepare_model`` so prepared models are known to the launch.

    Example::

        undo = register_prepared_models(accelerate.accelerator)
    """
    accelerator_class = accelerator_module.Accelerator
    original = accelerator_class.__dict__["prepare_model"]

    @functools.wraps(original)
    def prepare_model(accelerator: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        context = current_launch()
        if context is not None:
            context.register_prepared_model(model)
        return original(accelerator, model, *args, **kwargs)

    accelerator_class.prepare_model = prepare_model
    return lambda: setattr(accelerator_class, "prepare_model", original)
