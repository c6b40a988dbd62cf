"""What every way of wrapping a model offers the Accelerator: the :class:`Strategy` protocol.

The Accelerator's Accelerate-named verbs (``prepare``, ``unwrap_model``, ``no_sync``,
``clip_grad_norm_``, ``get_state_dict``, ``save_state``/``load_state``) ask the one strategy
object it holds, so what a wrapper means lives in one class: plain single-process, DDP or FSDP2.
A new wrapper is one more class here, not more ``isinstance`` branches in the Accelerator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from notebook_kit.accelerator.partial_state import DistributedType

__all__ = ["CheckpointParts", "Strategy", "clip_plain"]


@dataclass
class CheckpointParts:
    """What ``save_state`` writes for the models and optimizers, as a strategy sees them.

    Attributes:
        models: Objects with ``state_dict``/``load_state_dict`` that rank 0 writes as
            ``model_<i>.pt`` (identical on every rank: DDP, one process, a gathered FSDP state).
        optimizers: The same for ``optimizer_<i>.pt``.
        sharded: Parts every rank writes its own share of (FSDP's DCP folders), or None:
            an object with ``counts`` (kind -> number), ``state_dicts()`` (what it writes, taken
            at the call), ``write(folder, states, process_group)`` and ``load(folder)``.
    """

    models: Sequence[Any] = ()
    optimizers: Sequence[Any] = ()
    sharded: Any = None
    counts: dict[str, int] = field(default_factory=dict)


class Strategy(Protocol):
    """One way to wrap a model for training; the Accelerator holds exactly one.

    Attributes:
        distributed_type: What ``accelerator.distributed_type`` reports under it.
        can_join: Whether ``join_uneven_inputs`` applies (DDP's ``Join``).
        times_collectives: Whether a backward pass ends waiting for a gradient reduction a
            step clock can time (DDP's all-reduce), for the speed line's collective wait.
    """

    distributed_type: DistributedType
    can_join: bool
    times_collectives: bool

    def wrap(self, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> nn.Module:
        """The model to train with; ``optimizers`` were prepared with it (FSDP remaps them)."""
        ...

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever ``wrap`` returned."""
        ...

    def grad_scaler(self, options: dict[str, Any]) -> Any:
        """fp16's loss scaler (``GradScalerKwargs`` fields in ``options``), else None."""
        ...

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Backward passes inside the block keep gradients local (accumulation)."""
        ...

    def trigger_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """The next backward syncs gradients although forwards ran under ``no_sync``."""
        ...

    def clip_grad_norm(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> Any:
        """Clip the gradients' total norm over all ranks; returns that norm."""
        ...

    def full_state_dict(self, model: nn.Module, call: str) -> dict[str, Any]:
        """The whole model's state dict (a collective where sharded; ``call`` names it)."""
        ...

    def checkpoint_parts(
        self, models: Sequence[nn.Module], optimizers: Sequence[Any]
    ) -> CheckpointParts:
        """What ``save_state``/``load_state`` write and read for these objects."""
        ...

    def enter_collective(self, call: str) -> None:
        """Called by every rank before a collective the user started (``save_state`` ...).

        Raises an error naming ``call`` and the ranks that entered it when only some ranks
        do, instead of waiting for the process group's timeout.
        """
        ...


def clip_plain(parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float) -> Any:
    """``torch.nn.utils.clip_grad_norm_`` on unsharded gradients (DDP keeps them in sync)."""
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
