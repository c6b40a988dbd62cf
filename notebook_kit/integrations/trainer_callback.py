"""``LiveViewCallback``: a Hugging Face ``Trainer`` drives notebook_kit's live view.

Importing this module imports ``transformers`` (the ``notebook_kit[transformers]`` extra).
Under ``notebook_launcher`` every ``Trainer`` gets the callback without being asked
(:mod:`notebook_kit.integrations.trainer_launch`); pass it yourself to use it elsewhere.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from notebook_kit.runtime import stopping
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.metrics import flush, log_from_worker
from notebook_kit.runtime.progress import report_steps, report_total

__all__ = ["LiveViewCallback"]

# Timings and counters the Trainer logs next to its metrics: not training curves, so they
# stay out of the plot (``trainer.train().metrics`` still has them).
_NOT_PLOTTED = re.compile(r"(_runtime|_per_second|^total_flos)$")


class LiveViewCallback(TrainerCallback):
    """Streams a Trainer's logs to the live plot, its step count to the progress bar, and
    ends training at the same step on every rank when the Stop button is clicked.

    Loss, learning rate, gradient norm, epoch and evaluation metrics reach the plot and
    ``last_run().metrics`` at the Trainer's ``global_step``; the model given to the Trainer
    is the one whose trained weights come home to the kernel. Stopping goes through the
    Trainer's own control flow (``control.should_training_stop``), so ``train()`` returns
    normally. Outside a launch the callback does nothing.

    Example::

        from notebook_kit.integrations import LiveViewCallback
        trainer = Trainer(model, args, train_dataset=data, callbacks=[LiveViewCallback()])
    """

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        context = current_launch()
        if context is None:
            return
        if model is not None:  # its trained weights go home to the kernel's object
            context.register_prepared_model(_unwrap(model))
        report_total(context, state.max_steps or None)
        report_steps(context, state.global_step)  # a resumed run starts part-way

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        context = current_launch()
        if context is None:
            return
        report_steps(context, state.global_step)
        # A collective: every rank reaches on_step_end once per optimizer step.
        if stopping.should_stop(context):
            control.should_training_stop = True

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        values = {name: value for name, value in (logs or {}).items() if _plotted(name, value)}
        if values:
            log_from_worker(current_launch(), values, step=state.global_step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        flush(current_launch())  # the last logs reach the plot before evaluation or return


def _plotted(name: str, value: Any) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and not _NOT_PLOTTED.search(name)


def _unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside (Distributed)DataParallel."""
    while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        model = model.module
    return model
