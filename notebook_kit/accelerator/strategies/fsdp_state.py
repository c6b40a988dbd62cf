"""FSDP2 state dicts: the full model gathered to rank 0, and the parts ``save_state`` writes.

``SHARDED_STATE_DICT`` (the default) writes, per model and optimizer, a
``torch.distributed.checkpoint`` (DCP) folder to which every rank writes its own shard —
``pytorch_model_fsdp_<i>/`` and ``optimizer_<i>/`` as Accelerate names them — inside the
checkpoint's staging folder, so the manifest commit makes them atomic like every other file.
``FULL_STATE_DICT`` gathers the whole model and optimizer to rank 0, which writes
``model_<i>.pt`` and ``optimizer_<i>.pt``; every rank reads them back and keeps its shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from notebook_kit.accelerator.checkpoint_files import (
    CheckpointError,
    load_file,
    sharded_load_error,
    write_file,
)
from notebook_kit.accelerator.storage import StoragePath, dcp_options

__all__ = ["FullParts", "ShardedParts", "full_model_state", "load_full_model_state"]

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, Any]:
    """The whole model's state dict on rank 0, on the CPU ({} on other ranks); a collective."""
    return get_model_state_dict(model, options=_FULL)


def load_full_model_state(model: nn.Module, state: dict[str, Any], from_rank0: bool) -> None:
    """Load a full state dict into a sharded model (each rank keeps its shard)."""
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=from_rank0)
    set_model_state_dict(model, state, options=options)


def _raw(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)  # an AcceleratedOptimizer's own


class _Parts:
    """Models and optimizers, each optimizer paired with the model whose parameters it holds."""

    def __init__(self, models: Sequence[nn.Module], pairs: Sequence[tuple[nn.Module, Any]]):
        self.models = list(models)
        self.pairs = list(pairs)
        self.counts = {"models": len(self.models), "optimizers": len(self.pairs)}


class ShardedParts(_Parts):
    """Each rank writes and reads its own shard of every model and optimizer (DCP)."""

    def state_dicts(self) -> dict[str, Any]:
        """DCP folder name -> this rank's shard of what goes into it (live tensors)."""
        states: dict[str, Any] = {}
        for index, model in enumerate(self.models):
            states[f"pytorch_model_fsdp_{index}"] = {"model": get_model_state_dict(model)}
        for index, (model, optimizer) in enumerate(self.pairs):
            state = get_optimizer_state_dict(model, _raw(optimizer))
            states[f"optimizer_{index}"] = {"optimizer": state}
        return states

    def write(self, folder: StoragePath, states: dict[str, Any], process_group: Any) -> None:
        """Every rank writes its shards; DCP's own collectives go through ``process_group``
        (None: the default group), and a failure on one rank raises on every rank."""
        for name, state in states.items():
            options = dcp_options(folder / name, writing=True)
            dcp.save(state, process_group=process_group, **options)

    def load(self, folder: StoragePath) -> None:
        for index, model in enumerate(self.models):
            state = {"model": get_model_state_dict(model)}
            _dcp_load(state, _model_dir(folder, index))
            set_model_state_dict(model, state["model"])
        for index, (model, optimizer) in enumerate(self.pairs):
            state = {"optimizer": get_optimizer_state_dict(model, _raw(optimizer))}
            _dcp_load(state, folder / f"optimizer_{index}")
            set_optimizer_state_dict(model, _raw(optimizer), state["optimizer"])


class FullParts(_Parts):
    """Rank 0 writes the gathered model and optimizer; every rank reads them and reshards."""

    def __init__(
        self, models: Sequence[nn.Module], pairs: Sequence[tuple[nn.Module, Any]], rank: int
    ):
        super().__init__(models, pairs)
        self.rank = rank

    def state_dicts(self) -> dict[str, Any]:
        """File name -> the gathered state on rank 0 ({} on the others); a collective."""
        states: dict[str, Any] = {}
        for index, model in enumerate(self.models):
            states[f"model_{index}.pt"] = full_model_state(model)
        for index, (model, optimizer) in enumerate(self.pairs):
            state = get_optimizer_state_dict(model, _raw(optimizer), options=_FULL)
            states[f"optimizer_{index}.pt"] = state
        return states

    def write(self, folder: StoragePath, states: dict[str, Any], process_group: Any) -> None:
        """Rank 0 writes the gathered files; the others hold nothing to write."""
        if self.rank == 0:
            for name, state in states.items():
                write_file(state, folder / name)

    def load(self, folder: StoragePath) -> None:
        for index, model in enumerate(self.models):
            load_full_model_state(model, load_file(folder / f"model_{index}.pt"), from_rank0=False)
        for index, (model, optimizer) in enumerate(self.pairs):
            state = load_file(folder / f"optimizer_{index}.pt")
            options = StateDictOptions(full_state_dict=True)
            set_optimizer_state_dict(model, _raw(optimizer), state, options=options)


def _model_dir(folder: StoragePath, index: int) -> StoragePath:
    return folder / f"pytorch_model_fsdp_{index}"


def _dcp_load(state: dict[str, Any], path: StoragePath) -> None:
    if not (path / ".metadata").is_file():
        raise CheckpointError(
            f"{path} holds no sharded checkpoint (.metadata is missing): it was saved without "
            "FSDP or with state_dict_type='FULL_STATE_DICT'; load it the way it was saved."
        )
    try:
        dcp.load(state, **dcp_options(path, writing=False))
    except CheckpointException as error:  # a BaseException: ``except Exception`` misses it
        raise sharded_load_error(error, path) from error
