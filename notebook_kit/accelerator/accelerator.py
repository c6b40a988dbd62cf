"""The Accelerator: one training loop for one process, for N launched processes, or torchrun.

Names and meanings follow Hugging Face Accelerate's ``Accelerator``, so a loop written for it
runs after changing its import. All state lives in the instance (no process-wide singleton):
an Accelerator built in the kernel never leaks into launched workers, and re-running a cell
always starts clean.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from notebook_kit.accelerator.accelerate_objects import adopt
from notebook_kit.accelerator.async_save import BackgroundSaves
from notebook_kit.accelerator.checkpoint_methods import CheckpointMethods
from notebook_kit.accelerator.configuration import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
)
from notebook_kit.accelerator.data_loader import PreparedDataLoader, prepare_data_loader
from notebook_kit.accelerator.distributed_methods import DistributedMethods
from notebook_kit.accelerator.handlers import apply_process_group_options, sort_handlers
from notebook_kit.accelerator.optimizer import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
    GradientState,
)
from notebook_kit.accelerator.parallel_methods import ParallelMethods
from notebook_kit.accelerator.partial_state import AcceleratorState, as_accelerates
from notebook_kit.accelerator.precision import (
    MIXED_PRECISION_CHOICES,
    MixedPrecision,
    restore_forward,
)
from notebook_kit.accelerator.process_methods import ProcessMethods
from notebook_kit.accelerator.settings import (
    accumulation_plugin,
    check_choice,
    check_flag,
    check_rng_types,
    check_steps,
    loader_configuration,
)
from notebook_kit.accelerator.state import resolve_process_state, resolve_setting
from notebook_kit.accelerator.storage import is_local, storage_path
from notebook_kit.accelerator.strategies import (
    Strategy,
    fsdp_from_settings,
    parallelism_from_settings,
    select_strategy,
)
from notebook_kit.integrations.trackers import check_log_with
from notebook_kit.runtime.context import LaunchContext, current_launch
from notebook_kit.runtime.log_values import LoggedHistory
from notebook_kit.runtime.metrics import speed_counter
from notebook_kit.runtime.peak_flops import peak_flops
from notebook_kit.runtime.throughput import model_flops, watch_gradients

__all__ = ["Accelerator"]


def _is_scheduler(obj: Any) -> bool:
    if isinstance(obj, (torch.optim.Optimizer, AcceleratedScheduler)):
        return False
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and isinstance(getattr(obj, "optimizer", None), torch.optim.Optimizer)
    )


class Accelerator(CheckpointMethods, ProcessMethods, DistributedMethods, ParallelMethods):
    """Runs a PyTorch training loop on one process or many, with Accelerate's API.

    Args:
        device_placement: Move prepared models and batches to ``device``.
        split_batches: Shorthand for ``DataLoaderConfiguration(split_batches=...)``.
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"``; None inherits the launch's
            setting, then ``NOTEBOOK_KIT_MIXED_PRECISION``, then ``"no"``.
        gradient_accumulation_steps: Micro-steps per optimizer step; None inherits like
            ``mixed_precision`` (``NOTEBOOK_KIT_GRADIENT_ACCUMULATION_STEPS``), default 1.
        cpu: Stay on the CPU even when CUDA is available.
        dataloader_config: How DataLoaders are sharded (:class:`DataLoaderConfiguration`).
        even_batches: Shorthand for ``DataLoaderConfiguration(even_batches=...)``.
        rng_types: Random generators made equal on every process at the start of each pass
            over a prepared DataLoader: ``"generator"`` (the sampler's, the default),
            ``"torch"``, ``"cuda"``.
        project_dir: Where ``save_state()``/``load_state()`` without a directory keep
            ``checkpoints/checkpoint_<n>``: a local path, a folder every node mounts, or an
            fsspec URL such as ``s3://bucket/run`` (``ProjectConfiguration.storage_options``).
        project_config: Accelerate's ``ProjectConfiguration``: ``project_dir`` (if not given
            directly) and ``total_limit``, the number of numbered checkpoints kept.
        gradient_accumulation_plugin: A :class:`GradientAccumulationPlugin` (instead of
            ``gradient_accumulation_steps``).
        step_scheduler_with_optimizer: Step schedulers only when the optimizer stepped.
        kwargs_handlers: ``DistributedDataParallelKwargs``, ``GradScalerKwargs``,
            ``InitProcessGroupKwargs``, ``AutocastKwargs``, ``ProfileKwargs`` (one of each at
            most).
        log_with: Trackers that ``log`` also writes to, besides ``logged`` and the notebook's
            live plot (always fed): ``"tensorboard"`` (event files under ``project_dir``), a
            tracker object with Accelerate's ``GeneralTracker`` interface, or a list of them;
            None or ``"all"``: the live plot only. Trackers start at ``init_trackers``.
        fsdp_plugin: A ``FullyShardedDataParallelPlugin`` (ours or Accelerate's): shard the
            model with FSDP2 over the launch's processes (``ACCELERATE_USE_FSDP=true`` makes
            one from the ``FSDP_*`` variables).
        parallelism_config: A ``ParallelismConfig`` (ours or Accelerate's): HSDP
            (``dp_replicate_size`` × ``dp_shard_size``), tensor parallel (``tp_size``) and
            context parallel (``cp_size``) on one ``torch_device_mesh``; None: from the
            launch's ``parallelism_config_*`` sizes when any is above 1 (docs/parallelism.md).

    Example::

        accelerator = Accelerator(mixed_precision="bf16",
            dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for inputs, targets in loader:
            loss = loss_fn(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step(); optimizer.zero_grad()
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: MixedPrecision | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool = False,
        *,
        dataloader_config: DataLoaderConfiguration | None = None,
        even_batches: bool | None = None,
        rng_types: list[str] | None = None,
        project_dir: str | os.PathLike[str] | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[Any] | None = None,
        log_with: str | Any | list[Any] | None = None,
        fsdp_plugin: Any = None,
        parallelism_config: Any = None,
    ) -> None:
        self.device_placement = check_flag("device_placement", device_placement)
        self.dataloader_config = loader_configuration(
            dataloader_config, split_batches, even_batches
        )
        self.rng_types = check_rng_types(rng_types)
        self.step_scheduler_with_optimizer = check_flag(
            "step_scheduler_with_optimizer", step_scheduler_with_optimizer
        )
        check_flag("cpu", cpu)
        check_choice("mixed_precision", mixed_precision, (*MIXED_PRECISION_CHOICES, None))
        self.handlers = sort_handlers(kwargs_handlers)
        launch = current_launch()
        self.mixed_precision: MixedPrecision = resolve_setting(
            "mixed_precision", mixed_precision, launch and launch.mixed_precision
        )
        plugin = accumulation_plugin(
            gradient_accumulation_plugin, check_steps(gradient_accumulation_steps)
        )
        steps = resolve_setting(
            "gradient_accumulation_steps",
            plugin.num_steps,
            launch and launch.gradient_accumulation_steps,
        )
        check_steps(steps)
        project = adopt(project_config, ProjectConfiguration, "project_config")
        project = project or ProjectConfiguration()
        project_dir = project_dir if project_dir is not None else project.project_dir
        self.project_dir = (
            storage_path(project_dir, project.storage_options, name="project_dir")
            if project_dir is not None
            else None
        )
        self.total_limit = project.total_limit
        logging_dir = project.logging_dir
        if logging_dir is None and self.project_dir is not None and is_local(self.project_dir):
            logging_dir = self.project_dir  # trackers write files: not to a URL by default
        self.logging_dir = Path(logging_dir) if logging_dir is not None else None
        self.log_with = check_log_with(log_with, self.logging_dir)
        self.trackers: list[Any] = []
        self.tracker_config: dict[str, Any] = {}
        self._trigger = False  # set_trigger's flag on this process, read by check_trigger
        self.state = AcceleratorState._from_process(
            resolve_process_state(cpu), mixed_precision=self.mixed_precision
        )
        apply_process_group_options(self.handlers.init)
        # What DDP, FSDP or one process means for wrapping, syncing, clipping and saving.
        self.strategy: Strategy = select_strategy(
            self.state,
            self.mixed_precision,
            self.handlers,
            fsdp_from_settings(fsdp_plugin),
            parallelism_from_settings(parallelism_config),
        )
        self.state.distributed_type = as_accelerates(self.strategy.distributed_type)
        self.gradient_state = GradientState(
            steps, plugin.adjust_scheduler, plugin.sync_with_dataloader, plugin.sync_each_batch
        )
        self.scaler = self.strategy.grad_scaler(self.handlers.scaler_options())
        self.logged = LoggedHistory()  # the latest records, read when looked at
        self._models: list[nn.Module] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[PreparedDataLoader] = []
        self._custom_objects: list[Any] = []
        self._background_saves = BackgroundSaves()  # save_state(async_save=True)

    # -- prepare ---------------------------------------------------------------------------

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, dataloaders and schedulers, in any order.

        Returns them in the same order (a single object when given one).

        Example::

            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        """
        placements = device_placement or [self.device_placement] * len(args)
        # A sharding strategy remaps the parameters of optimizers prepared with their model.
        optimizers = [obj for obj in args if isinstance(obj, torch.optim.Optimizer)]
        prepared = [
            obj if _is_scheduler(obj) else self._prepare_one(obj, placement, optimizers)
            for obj, placement in zip(args, placements, strict=True)
        ]
        # Schedulers last: they are linked to optimizers prepared in the same call or before.
        prepared = [
            self.prepare_scheduler(obj) if _is_scheduler(obj) else done
            for obj, done in zip(args, prepared, strict=True)
        ]
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def _prepare_one(
        self, obj: Any, placement: bool, optimizers: list[torch.optim.Optimizer]
    ) -> Any:
        if isinstance(obj, nn.Module):
            return self._prepare_model(obj, placement, optimizers)
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj)
        if isinstance(obj, DataLoader):
            return self.prepare_data_loader(obj)
        return obj

    def prepare_model(self, model: nn.Module, device_placement: bool | None = None) -> nn.Module:
        """Move ``model`` to the device; wrap it in DDP on several processes, autocast if set.

        On one process the result is ``model`` itself (with mixed precision its forward runs
        under autocast), so its attributes, methods and type stay as they were; under DDP
        ``prepared.module`` is ``model``.

        Example::

            model = accelerator.prepare_model(model)
        """
        placement = self.device_placement if device_placement is None else device_placement
        return self._prepare_model(model, placement, [])

    def _prepare_model(
        self, model: nn.Module, placement: bool, optimizers: list[torch.optim.Optimizer]
    ) -> nn.Module:
        launch = current_launch()
        if launch is not None:  # the launcher sends rank 0's weights back into this object
            launch.register_prepared_model(model)
            self._count_flops(launch, model)
            if self.strategy.times_collectives:  # the speed line's collective wait
                watch_gradients(model)
        self._models.append(model)
        # A model on `meta` has nothing to move: FSDP's cpu_ram_efficient_loading gives it
        # memory on the device, then rank 0's weights.
        if placement and not any(parameter.is_meta for parameter in model.parameters()):
            model.to(self.device)
        return self.strategy.wrap(model, optimizers)

    def _count_flops(self, launch: LaunchContext, model: nn.Module) -> None:
        """The speed line's MFU: the first model's FLOPs (whole, before any sharding) and the
        peak of this rank's GPU at the run's precision."""
        counter = speed_counter(launch)
        if counter is None or counter.model is not None:
            return
        counter.model = model_flops(model)
        if self.device.type == "cuda":
            precision = self.mixed_precision if self.mixed_precision != "no" else "fp32"
            if precision == "fp32" and torch.backends.cuda.matmul.allow_tf32:
                precision = "tf32"
            counter.peak_flops = peak_flops(torch.cuda.get_device_name(self.device), precision)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        """Wrap ``optimizer`` so it respects accumulation and fp16 loss scaling.

        Example::

            optimizer = accelerator.prepare_optimizer(optimizer)
        """
        wrapped = AcceleratedOptimizer(optimizer, self.gradient_state, self.scaler)
        self._optimizers.append(wrapped)
        return wrapped

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap an LR scheduler so it steps as Accelerate steps it.

        Example::

            scheduler = accelerator.prepare_scheduler(scheduler)
        """
        linked = [opt for opt in self._optimizers if opt.optimizer is scheduler.optimizer]
        wrapped = AcceleratedScheduler(
            scheduler,
            linked or self._optimizers,
            self.gradient_state,
            self.num_processes,
            self.split_batches,
            self.step_scheduler_with_optimizer,
        )
        self._schedulers.append(wrapped)
        return wrapped

    def prepare_data_loader(self, data_loader: DataLoader) -> PreparedDataLoader:
        """Shard ``data_loader`` for this process.

        Example::

            loader = accelerator.prepare_data_loader(DataLoader(dataset, batch_size=32))
        """
        shards, shard = self._data_shards()  # a tp or cp group reads one batch together
        prepared = prepare_data_loader(
            data_loader,
            num_processes=shards,
            process_index=shard,
            gradient_state=self.gradient_state,
            device=self.device if self.device_placement else torch.device("cpu"),
            rng_types=self.rng_types,
            # DataLoaderConfiguration's fields are prepare_data_loader's keywords, as in Accelerate.
            **dataclasses.asdict(self.dataloader_config),
        )
        self._dataloaders.append(prepared)
        reads_for_its_group = getattr(self.strategy, "reads_for_its_group", None)
        counter = speed_counter(current_launch())
        if counter is not None and reads_for_its_group is not None:
            counter.repeats = not reads_for_its_group()  # its group's batch is counted once
        return prepared

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True) -> nn.Module:
        """The user's module inside the DDP wrapper.

        With ``keep_fp32_wrapper=False`` its forward no longer runs under autocast.

        Example::

            torch.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
        """
        model = self.strategy.unwrap(model)
        return model if keep_fp32_wrapper else restore_forward(model)

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's state dict (of the unwrapped module by default).

        Example::

            state = accelerator.get_state_dict(model)
        """
        return (
            self.strategy.full_state_dict(model, "get_state_dict") if unwrap else model.state_dict()
        )

    def free_memory(self) -> None:
        """Forget every prepared object, so they can be garbage-collected."""
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self._custom_objects.clear()
        self.gradient_state = GradientState(self.gradient_state.num_steps)

    def __repr__(self) -> str:
        return (
            f"Accelerator(process {self.process_index} of {self.num_processes}, "
            f"device={self.device}, mixed_precision={self.mixed_precision!r}, "
            f"gradient_accumulation_steps={self.gradient_accumulation_steps})"
        )
