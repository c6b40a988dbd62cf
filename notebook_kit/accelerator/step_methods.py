"""The Accelerator's training step: backward, accumulation, autocast and gradient clipping.

Kept apart from ``accelerator.py`` so each file has one job: there, building and preparing;
here, what a loop calls on every micro-step, each deferring to the strategy (DDP, FSDP or one
process) for what differs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from notebook_kit.accelerator.precision import MixedPrecision, autocast_context
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.metrics import step_clock

if TYPE_CHECKING:
    from notebook_kit.accelerator.configuration import AutocastKwargs
    from notebook_kit.accelerator.handlers import Handlers
    from notebook_kit.accelerator.optimizer import AcceleratedOptimizer, GradientState
    from notebook_kit.accelerator.strategies import Strategy

__all__ = ["StepMethods"]


class StepMethods:
    """The per-step calls of :class:`~notebook_kit.accelerator.Accelerator` (Accelerate's names).

    Every attribute it reads is declared here and created by ``Accelerator.__init__``.
    """

    device: torch.device
    gradient_state: GradientState
    handlers: Handlers
    mixed_precision: MixedPrecision
    scaler: torch.amp.GradScaler | None
    strategy: Strategy
    sync_gradients: bool
    use_distributed: bool
    _optimizers: list[AcceleratedOptimizer]

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled for fp16.

        Example::

            accelerator.backward(loss)
        """
        if self.gradient_state.num_steps > 1:
            loss = loss / self.gradient_state.num_steps
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        clock = step_clock(current_launch()) if self.strategy.times_collectives else None
        if clock is None:
            loss.backward(**kwargs)
        else:  # the collective wait: from the model's last gradient to the return
            clock.time_backward(loss, **kwargs)

    @contextlib.contextmanager
    def accumulate(self, *models: nn.Module) -> Iterator[None]:
        """One micro-step: gradients are all-reduced only on the step that applies them.

        Example::

            with accelerator.accumulate(model):
                accelerator.backward(loss_fn(model(x), y))
                optimizer.step(); optimizer.zero_grad()
        """
        self.gradient_state.advance()
        # sync_each_batch all-reduces every micro-step (the optimizer still waits for the sync).
        each_batch = self.use_distributed and self.gradient_state.sync_each_batch
        with contextlib.ExitStack() as stack:
            if not (self.sync_gradients or each_batch):
                for model in models:
                    stack.enter_context(self.no_sync(model))
            yield

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Skip DDP's gradient all-reduce inside the block (no-op on one process).

        Example::

            with accelerator.no_sync(model):
                accelerator.backward(loss)
        """
        with self.strategy.no_sync(model):
            yield

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> Any:
        """Autocast context for code outside the prepared model's forward (e.g. the loss).

        ``autocast_handler`` overrides the ``AutocastKwargs`` given to the constructor.

        Example::

            with accelerator.autocast():
                loss = loss_fn(model(x), y)
        """
        handler = autocast_handler or self.handlers.autocast
        options = handler.to_kwargs() if handler is not None else {}
        return autocast_context(self.mixed_precision, self.device, **options)

    def unscale_gradients(self) -> None:
        """Undo fp16 loss scaling on the gradients (once per optimizer step)."""
        if self.scaler is not None and self.sync_gradients:
            for optimizer in self._optimizers:
                self.scaler.unscale_(optimizer.optimizer)

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the gradients' total norm (after undoing fp16 scaling); returns the norm.

        Example::

            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
        """
        self.unscale_gradients()
        return self.strategy.clip_grad_norm(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clamp every gradient to ``[-clip_value, clip_value]`` (after undoing fp16 scaling).

        Example::

            accelerator.clip_grad_value_(model.parameters(), 0.5)
        """
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)
