"""Every ``Trainer`` built inside a launch joins it: right world size, live view, quiet cell.

Applied by :mod:`notebook_kit.integrations.activation` once ``transformers.trainer`` is
imported in a launched process, and undone when the launch ends. ``Trainer.__init__`` is
wrapped (subclasses such as ``Seq2SeqTrainer`` call it too) so that each new Trainer:

- recomputes ``TrainingArguments`` made before the launch (in the kernel, where the
  Trainer's device setup saw a single process and cached that answer);
- gets a :class:`LiveViewCallback` unless one was passed;
- drops the Trainer's tqdm bar and log printer, whose output the live view replaces (each
  would write to the cell from every rank);
- does not ask for pinned memory on the CPU (which only warns there, once per rank);
- trains sharded when ``TrainingArguments(fsdp=...)`` asks for it, or refuses: Accelerate
  turns FSDP on only for GPU jobs and would otherwise train an unsharded DDP copy.

Nothing here imports ``transformers``: it is handed the already imported module.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from types import ModuleType
from typing import Any

from notebook_kit.integrations.post_import import Undo
from notebook_kit.runtime.context import LaunchContext

__all__ = ["adopt_trainers"]


def adopt_trainers(trainer_module: ModuleType, context: LaunchContext) -> Undo:
    """Wrap ``trainer_module.Trainer.__init__`` for this launch; returns the undo.

    Example::

        undo = adopt_trainers(transformers.trainer, current_launch())
    """
    trainer_class = trainer_module.Trainer
    original = trainer_class.__dict__["__init__"]

    @functools.wraps(original)
    def __init__(trainer: Any, *args: Any, **kwargs: Any) -> None:
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if training_args is not None:
            _refresh_devices(training_args, context)
        original(trainer, *args, **kwargs)
        _check_sharded(trainer)
        _join_live_view(trainer)

    trainer_class.__init__ = __init__
    return lambda: setattr(trainer_class, "__init__", original)


def _refresh_devices(training_args: Any, context: LaunchContext) -> None:
    """Set the arguments' devices up again if that was done outside this launch.

    ``TrainingArguments`` caches its device setup (a ``cached_property``) when it is made.
    Made in the kernel, it saw one process; the worker's copy must see the launch.
    """
    cached = "_setup_devices" in vars(training_args)
    state = getattr(training_args, "distributed_state", None)
    if not cached or state is None:
        return
    # Accelerate's state lives in a shared dict, cleared in a worker when it was the kernel's.
    current = state.initialized and (state.num_processes, state.process_index)
    if current == (context.world_size, context.rank):
        return
    del training_args.__dict__["_setup_devices"]
    training_args.distributed_state = None
    _ = training_args.device  # recomputed here, in this process's launch


def _check_sharded(trainer: Any) -> None:
    """Refuse a Trainer that was asked for FSDP but would train unsharded."""
    requested = getattr(trainer.args, "fsdp", None)
    if not requested or getattr(trainer, "is_fsdp_enabled", False):
        return
    if isinstance(requested, (list, tuple)):  # a list of FSDPOption in older Transformers
        requested = " ".join(str(getattr(option, "value", option)) for option in requested)
    raise ValueError(
        f"TrainingArguments(fsdp={requested!r}) asks for FSDP, but on this "
        f"{trainer.args.device.type.upper()} run Accelerate would train an unsharded DDP copy "
        "instead (it enables FSDP for GPU jobs only). Either train on GPUs, or drop fsdp= from "
        "the TrainingArguments, or shard on the CPU with notebook_kit's own loop: "
        "Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()) (see docs/fsdp.md)."
    )


def _join_live_view(trainer: Any) -> None:
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from notebook_kit.integrations.trainer_callback import LiveViewCallback

    callbacks = trainer.callback_handler.callbacks
    if not any(isinstance(callback, LiveViewCallback) for callback in callbacks):
        trainer.add_callback(LiveViewCallback())
    quiet = (PrinterCallback, ProgressCallback, *_notebook_progress_callback())
    for callback in [callback for callback in callbacks if isinstance(callback, quiet)]:
        trainer.remove_callback(callback)
    arguments = trainer.args
    if arguments.dataloader_pin_memory and arguments.device.type == "cpu":
        with contextlib.suppress(AttributeError, TypeError):  # frozen arguments: leave them
            arguments.dataloader_pin_memory = False


def _notebook_progress_callback() -> tuple[type, ...]:
    """The Trainer's notebook bar (its module imports IPython widgets: only if loaded)."""
    module = sys.modules.get("transformers.utils.notebook")
    return (module.NotebookProgressCallback,) if module is not None else ()
