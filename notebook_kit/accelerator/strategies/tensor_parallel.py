"""Splitting layers over a tensor-parallel group, and the device mesh it lives on.

A transformers model brings its plan (``model.tp_plan``: module name with ``*`` for a layer
number -> a style name such as ``"colwise"``), applied with transformers' own styles, as
``from_pretrained(tp_plan="auto")`` would. A plain torch model takes the plan given as
``ParallelismConfig(tp_plan={...})`` in ``parallelize_module``'s styles (``ColwiseParallel()``,
``RowwiseParallel()``...). A model whose parameters are DTensors already (loaded with
``tp_plan="auto"`` and ``device_mesh=accelerator.torch_device_mesh["tp"]``) is kept as it is.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from notebook_kit.config.mesh_layout import MeshLayout

__all__ = ["apply_tensor_parallel", "build_device_mesh", "expand_plan", "fsdp_mesh"]


def build_device_mesh(
    device: torch.device, layout: MeshLayout
) -> tuple[DeviceMesh, dict[str, DeviceMesh]]:
    """The mesh of ``layout``, and Accelerate's flattened dimensions (``dp``,
    ``dp_shard_cp``, ``dp_cp``) by name, which the mesh also answers to; a collective.

    A CPU run whose default group is nccl gets gloo groups: nccl cannot move CPU tensors.
    """
    override = None
    if device.type == "cpu" and dist.get_backend() != "gloo":
        override = dict.fromkeys(layout.names, "gloo")
    mesh = init_device_mesh(
        device.type, layout.sizes, mesh_dim_names=layout.names, backend_override=override
    )
    flat = {name: mesh[parts]._flatten(name) for name, parts in layout.flattened().items()}
    return mesh, flat


def fsdp_mesh(mesh: DeviceMesh, flat: dict[str, DeviceMesh], names: list[str]) -> DeviceMesh:
    """The mesh FSDP2 shards over: ``dp_shard_cp``, after ``dp_replicate`` for HSDP."""
    parts = flat["dp_shard_cp"].mesh_dim_names or ()
    if len(parts) == 1 and parts[0] in (mesh.mesh_dim_names or ()):  # no cp: dp_shard itself
        names = [parts[0] if name == "dp_shard_cp" else name for name in names]
        return mesh[tuple(names)] if len(names) > 1 else flat["dp_shard_cp"]
    if len(names) == 1:
        return flat["dp_shard_cp"]
    with warnings.catch_warnings():  # HSDP with CP: torch asks to slice a flattened dim so
        warnings.filterwarnings("ignore", message="Slicing a flattened dim")
        return mesh[tuple(names)]


def expand_plan(model: nn.Module, plan: dict[str, Any]) -> dict[str, Any]:
    """One entry per module the plan names (``*`` matches one name part), its own parameters
    first, each with the module's style, as transformers' styles expect.

    Example:
        >>> layers = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> list(expand_plan(layers, {"*": "colwise"}))
        ['0.weight', '0.bias', '0', '1.weight', '1.bias', '1']
    """
    patterns = [(re.compile(re.escape(key).replace(r"\*", r"[^.]+") + "$"), key) for key in plan]
    expanded: dict[str, Any] = {}
    for name, module in model.named_modules():
        style = next((plan[key] for pattern, key in patterns if pattern.match(name)), None)
        if style is None:
            continue
        for parameter, _ in module.named_parameters(recurse=False):
            expanded[f"{name}.{parameter}" if name else parameter] = style
        expanded[name] = style
    return expanded


def _model_plan(model: nn.Module) -> dict[str, Any] | None:
    plan = getattr(model, "tp_plan", None)
    return dict(plan) if isinstance(plan, dict) and plan else None


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh, plan: dict[str, Any] | None) -> None:
    """Split ``model``'s layers over the ``tp`` ``mesh`` in place, by ``plan`` or its own.

    Raises:
        ValueError: No plan (a plain torch model without ``tp_plan=``), a plan naming no
            module of the model, or a model already split over a different size.
    """
    size = mesh.size()
    split = [p for p in model.parameters() if isinstance(p, DTensor)]
    if split:
        found = {p.device_mesh.size() for p in split}
        if found != {size}:
            raise ValueError(
                f"The model is already split over {sorted(found)} ranks, but tp_size={size}: "
                "load it with device_mesh=accelerator.torch_device_mesh['tp'], or leave the "
                "splitting to prepare()."
            )
        return
    plan = plan if plan is not None else _model_plan(model)
    if not plan:
        raise ValueError(
            f"tp_size={size} needs a plan saying how to split {type(model).__name__}'s layers: "
            "a transformers model brings its own (model.tp_plan); for any other model pass "
            "ParallelismConfig(tp_size=..., tp_plan={'fc1': ColwiseParallel(), "
            "'fc2': RowwiseParallel()}) in torch's parallelize_module styles."
        )
    wrong = [key for key, style in plan.items() if not isinstance(style, (str, ParallelStyle))]
    if wrong:
        raise TypeError(
            f"tp_plan[{wrong[0]!r}] must be a torch ParallelStyle (ColwiseParallel()...) or a "
            f"transformers style name ('colwise'...), got {type(plan[wrong[0]]).__name__}."
        )
    names = [name for name, _ in model.named_modules() if name]
    unmatched = [key for key in plan if not any(_matches(key, name) for name in names)]
    if unmatched:
        raise ValueError(
            f"tp_plan names {unmatched}, which {type(model).__name__} does not have; its "
            f"modules include {names[:8]}."
        )
    styles = {key: style for key, style in plan.items() if isinstance(style, ParallelStyle)}
    named = expand_plan(model, {k: s for k, s in plan.items() if isinstance(s, str)})
    if styles:
        parallelize_module(model, mesh, styles)
    if named:
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism

        apply_tensor_parallelism(model, mesh, named)


def _matches(key: str, name: str) -> bool:
    return re.fullmatch(re.escape(key).replace(r"\*", r"[^.]+"), name) is not None
