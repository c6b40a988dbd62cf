"""What a launch turns on in each of its processes for the frameworks the function uses.

Registered as a launch hook (:func:`notebook_kit.runtime.context.add_launch_hook`), so it runs
in every forked worker, in a run inside the kernel and under torchrun, when the launch becomes
active, and is undone when the launch ends. It imports no framework: each part waits for the
function (or the kernel, before the fork) to import the module it adjusts.

- ``ACCELERATE_USE_CPU=true`` when the launch trains on the CPU with several processes:
  without it Accelerate (and so the ``Trainer``) forms a multi-process CPU state only if told
  ``cpu=True``/``use_cpu=True``, and each rank would train alone on the whole data set.
- ``FORK_LAUNCHED=1``: the launcher owns the process group, so Accelerate's
  ``end_training()`` leaves it for the launcher to close.
- Accelerate's ``Accelerator`` and every ``Trainer`` join the launch (:mod:`.accelerate_launch`,
  :mod:`.trainer_launch`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from notebook_kit.integrations import accelerate_launch, trainer_launch
from notebook_kit.integrations.post_import import when_imported
from notebook_kit.runtime.context import LaunchContext, add_launch_hook, temporary_environment

__all__ = ["activate", "register"]


def register() -> None:
    """Make every launch in this process (and in workers forked from it) activate them.

    Example:
        >>> register()  # done when notebook_kit.integrations is imported
    """
    add_launch_hook(activate)


@contextlib.contextmanager
def activate(context: LaunchContext) -> Iterator[None]:
    """The integrations for one launch, undone when the block ends.

    Example::

        with activate(current_launch()):
            trainer.train()
    """
    settings = {"FORK_LAUNCHED": "1"}
    if context.world_size > 1 and context.backend == "gloo":
        settings["ACCELERATE_USE_CPU"] = "true"
    with contextlib.ExitStack() as stack:
        stack.enter_context(temporary_environment(settings))
        clear = functools.partial(accelerate_launch.clear_stale_state, context=context)
        stack.enter_context(when_imported("accelerate.state", clear))
        register_models = accelerate_launch.register_prepared_models
        stack.enter_context(when_imported("accelerate.accelerator", register_models))
        adopt = functools.partial(trainer_launch.adopt_trainers, context=context)
        stack.enter_context(when_imported("transformers.trainer", adopt))
        yield
