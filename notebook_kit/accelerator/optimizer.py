"""Optimizer and LR-scheduler wrappers that respect gradient accumulation and fp16 scaling.

They follow Accelerate's rules so a loop gives the same numbers with either library: the
optimizer only steps (and only zeroes gradients) on the micro-step that syncs gradients, a
scheduler only steps when its optimizer really stepped, and, unless batches are split, it
steps once per process so a schedule written for one process keeps its length.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

import torch

from notebook_kit.accelerator.delegated import Delegated

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["AcceleratedOptimizer", "AcceleratedScheduler", "GradientState"]


class _Loader(Protocol):
    end_of_dataloader: bool
    remainder: int


@dataclass(eq=False)  # shared by reference: identity, not value, is what matters
class GradientState:
    """Accumulation bookkeeping of one Accelerator, shared with its prepared objects.

    Attributes:
        num_steps: Micro-steps per optimizer step.
        sync_gradients: True on the micro-step where gradients are all-reduced and applied.
        step: Micro-steps since the last sync.
        adjust_scheduler: Micro-steps without a sync still count in a scheduler's step count.
        sync_with_dataloader: The last batch of a data loader always syncs.
        sync_each_batch: All-reduce gradients on every micro-step (the optimizer still waits).
    """

    num_steps: int
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
    sync_gradients: bool = field(default=True, init=False)
    step: int = field(default=0, init=False)
    _active: list[_Loader] = field(default_factory=list, init=False, repr=False)

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        """The accumulation settings, named as ``GradientAccumulationPlugin``'s fields."""
        return {item.name: getattr(self, item.name) for item in fields(self) if item.init}

    @property
    def active_dataloader(self) -> Any:
        """The prepared data loader being iterated (the innermost one), else None."""
        return self._active[-1] if self._active else None

    @property
    def in_dataloader(self) -> bool:
        return bool(self._active)

    @property
    def end_of_dataloader(self) -> bool:
        """True while the innermost running data loader hands out its last batch."""
        return bool(self._active) and self._active[-1].end_of_dataloader

    @property
    def remainder(self) -> int:
        """Real samples in the innermost loader's last round (-1: unknown or no padding)."""
        return self._active[-1].remainder if self._active else -1

    def begin(self, loader: _Loader) -> None:
        self._active.append(loader)

    def end(self, loader: _Loader) -> None:
        if loader in self._active:
            self._active.remove(loader)

    def advance(self) -> None:
        """Count one micro-step and decide whether it syncs (the end of data does, by default)."""
        if self.sync_with_dataloader and self.end_of_dataloader:
            self.step = 0
            self.sync_gradients = True
        else:
            self.step += 1
            self.sync_gradients = self.step % self.num_steps == 0


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps an optimizer: steps only when gradients are synced, through a GradScaler for fp16.

    Example::

        optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
        optimizer.step(); optimizer.zero_grad()
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_state: GradientState,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        # Deliberately not calling Optimizer.__init__: the wrapped optimizer owns all state.
        self.optimizer = optimizer
        self.scaler = scaler
        self.gradient_state = gradient_state
        self._stepped = True
        self._found_inf: torch.Tensor | None = None
        self._skipped: bool | None = False
        if scaler is not None:
            # GradScaler skips optimizer.step() on inf/nan gradients; a hook sees whether it ran
            # without reading the scale back, which would wait for the GPU on every step.
            optimizer.register_step_post_hook(self._note_step)

    def _note_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self._stepped = True
        # A fused optimizer (``_step_supports_amp_scaling``) is always stepped by GradScaler
        # and skips inside its kernel on overflow; GradScaler hands it the verdict as
        # ``found_inf`` for the duration of the step, so it is kept to be read on demand.
        self._found_inf = getattr(optimizer, "found_inf", None)

    @property
    def step_was_skipped(self) -> bool:
        """True when the last step was skipped because fp16 gradients overflowed.

        For a fused optimizer this reads the overflow flag from its device, so it waits for
        the step to finish: asked only when needed (a prepared scheduler asks each step, as
        GradScaler itself does for every other optimizer).
        """
        if self._skipped is None:
            found_inf, self._found_inf = self._found_inf, None
            self._skipped = not self._stepped or bool(found_inf is not None and found_inf.item())
        return self._skipped

    @step_was_skipped.setter
    def step_was_skipped(self, skipped: bool) -> None:
        self._skipped, self._found_inf = bool(skipped), None

    state = Delegated[Any]("optimizer")
    param_groups = Delegated[list[dict[str, Any]]]("optimizer")
    defaults = Delegated[dict[str, Any]]("optimizer")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        if not self.gradient_state.sync_gradients:
            return
        if self.scaler is None:
            self.optimizer.step(closure)
            self.step_was_skipped = False
            return
        self._stepped, self._found_inf = False, None
        self.scaler.step(self.optimizer, closure)
        self.scaler.update()
        self._skipped = None  # decided when asked: see step_was_skipped

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


@dataclass(eq=False, repr=False)  # a wrapper: compared and shown as itself
class AcceleratedScheduler:
    """Wraps an LR scheduler so it steps only when its optimizers really stepped.

    Example::

        scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer, 10))
        scheduler.step()
    """

    scheduler: Any
    optimizers: list[AcceleratedOptimizer]
    gradient_state: GradientState
    num_processes: int
    split_batches: bool
    step_with_optimizer: bool = True

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                # Counts the micro-step, as Accelerate does; this also keeps torch's
                # "scheduler.step() before optimizer.step()" check quiet.
                self.scheduler._step_count += 1
            return
        if any(optimizer.step_was_skipped for optimizer in self.optimizers):
            return
        # Without split_batches every process sees its own batch, so one optimizer step
        # consumes num_processes batches of the schedule's length.
        repeats = 1 if self.split_batches else self.num_processes
        total = getattr(self.scheduler, "total_steps", None)
        for _ in range(repeats):
            if total is not None and self.scheduler._step_count > total:
                break  # OneCycleLR raises past its end (a short last round)
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":  # not set yet (unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.scheduler, name)
