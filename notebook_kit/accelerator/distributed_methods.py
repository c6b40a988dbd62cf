"""The Accelerator's view of the job and its training step (a mixin; state is the Accelerator's).

The step's calls defer to the strategy (DDP, FSDP or one process) for what differs. Unlike
Accelerate, joining uneven inputs works on CPU processes (gloo) as well as on GPUs.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.algorithms.join import Join

from notebook_kit.accelerator.accelerate_objects import adopt
from notebook_kit.accelerator.delegated import Delegated
from notebook_kit.accelerator.partial_state import DistributedType
from notebook_kit.accelerator.precision import MixedPrecision, autocast_context
from notebook_kit.accelerator.profiling import ProfileKwargs, profile_block
from notebook_kit.accelerator.sharding import ShardedBatchSampler
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.metrics import step_clock

if TYPE_CHECKING:
    from notebook_kit.accelerator.configuration import AutocastKwargs, DataLoaderConfiguration
    from notebook_kit.accelerator.data_loader import PreparedDataLoader
    from notebook_kit.accelerator.handlers import Handlers
    from notebook_kit.accelerator.optimizer import AcceleratedOptimizer, GradientState
    from notebook_kit.accelerator.partial_state import AcceleratorState
    from notebook_kit.accelerator.strategies import Strategy

__all__ = ["DistributedMethods"]


class DistributedMethods:
    """Properties, the training step and DDP context managers (state set by the Accelerator)."""

    state: AcceleratorState
    strategy: Strategy
    gradient_state: GradientState
    dataloader_config: DataLoaderConfiguration
    handlers: Handlers
    mixed_precision: MixedPrecision
    scaler: torch.amp.GradScaler | None
    _dataloaders: list[PreparedDataLoader]
    _optimizers: list[AcceleratedOptimizer]

    device = Delegated[torch.device]("state")
    process_index = Delegated[int]("state")
    local_process_index = Delegated[int]("state")
    num_processes = Delegated[int]("state")

    @property
    def use_distributed(self) -> bool:
        return self.state.num_processes > 1

    sync_gradients = Delegated[bool]("gradient_state")
    gradient_accumulation_steps = Delegated[int]("gradient_state", "num_steps")
    step = Delegated[int]("gradient_state", doc="Micro-steps since gradients were last synced.")

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when fp16 loss scaling skipped the last optimizer step (inf/nan gradients)."""
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)

    distributed_type = Delegated[DistributedType](
        "state", doc="``DistributedType.NO``, ``MULTI_CPU``, ``MULTI_GPU`` or ``FSDP``."
    )

    @property
    def is_fsdp2(self) -> bool:
        """True when the model is sharded with FSDP2 (``Accelerator(fsdp_plugin=...)``)."""
        return self.distributed_type == DistributedType.FSDP

    @property
    def multi_device(self) -> bool:
        """True when several processes train with DistributedDataParallel."""
        # Accelerate's meaning: a replicated data-parallel job (not FSDP, not DeepSpeed).
        replicated = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
        return self.state.num_processes > 1 and self.distributed_type in replicated

    split_batches = Delegated[bool]("dataloader_config")

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"even_batches must be True or False, got {value!r}.")
        self.dataloader_config.even_batches = value

    dispatch_batches = Delegated["bool | None"]("dataloader_config")
    use_seedable_sampler = Delegated[bool]("dataloader_config")
    non_blocking = Delegated[bool]("dataloader_config")
    use_stateful_dataloader = Delegated[bool](
        "dataloader_config", doc="Always effectively True: every prepared loader resumes mid-epoch."
    )

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

    def profile(self, profile_handler: ProfileKwargs | None = None) -> Any:
        """Profile the block with ``torch.profiler``; the context manager yields the profiler.

        ``profile_handler`` (ours or Accelerate's ``ProfileKwargs``) overrides the one given to
        the constructor. With its ``output_trace_dir``, each rank writes
        ``profile_<process_index>.json`` there when the block ends, then waits for the others.

        Example::

            with accelerator.profile() as prof:
                for batch in loader:
                    train_step(batch)
                    prof.step()
            accelerator.print(prof.key_averages().table(row_limit=10))
        """
        handler = adopt(profile_handler, ProfileKwargs, "profile_handler")
        if handler is not None and not isinstance(handler, ProfileKwargs):
            raise TypeError(
                f"profile_handler must be a ProfileKwargs (notebook_kit's or Accelerate's), "
                f"got {type(handler).__name__}."
            )
        handler = handler or self.handlers.profile or ProfileKwargs()
        return profile_block(handler, self.process_index, self.state.wait_for_everyone)

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

    @contextlib.contextmanager
    def join_uneven_inputs(
        self, joinables: Sequence[Any], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Let processes with fewer batches finish while the others still train (DDP Join).

        ``even_batches`` overrides the setting of every prepared map-style DataLoader inside the
        block; without ``even_batches=False`` every process has the same number of batches and
        the join is not needed.

        Example::

            with accelerator.join_uneven_inputs([model], even_batches=False):
                for batch in loader:
                    accelerator.backward(loss_fn(model(batch)))
        """
        if not (self.multi_device and self.strategy.can_join):
            if self.distributed_type != DistributedType.NO:
                warnings.warn(
                    "Joining uneven inputs is only supported for multi-GPU and multi-CPU "
                    "(DistributedDataParallel) training; join_uneven_inputs has no effect here.",
                    stacklevel=3,
                )
            yield
            return
        restore = self._override_even_batches(even_batches)
        effective = self.even_batches if even_batches is None else even_batches
        try:
            with Join(list(joinables), enable=not effective, throw_on_early_termination=False):
                yield
        finally:
            for sampler, value in restore:
                sampler.even_batches = value

    def _override_even_batches(self, even_batches: bool | None) -> list[tuple[Any, bool]]:
        if even_batches is None:
            return []
        restore, iterable_seen = [], False
        for loader in self._dataloaders:
            sampler = loader.batch_sampler
            if not isinstance(sampler, ShardedBatchSampler):
                iterable_seen = True
                continue
            restore.append((sampler, sampler.even_batches))
            sampler.even_batches = even_batches
        if iterable_seen:
            warnings.warn(
                "Overriding even_batches is only supported for map-style datasets; the "
                "DataLoaders over an IterableDataset keep their setting.",
                stacklevel=4,
            )
        return restore

    def trigger_sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Make the next backward all-reduce gradients after forwards run under ``no_sync``.

        Example::

            with accelerator.no_sync(model):
                losses = [loss_fn(model(x)) for x in micro_batches]
            for loss in losses[:-1]:
                accelerator.backward(loss)
            with accelerator.trigger_sync_in_backward(model):
                accelerator.backward(losses[-1])
        """
        return self.strategy.trigger_sync(model)
