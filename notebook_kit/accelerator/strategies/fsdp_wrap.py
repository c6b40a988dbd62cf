"""Which submodules FSDP2 shards on their own, and the parts of sharding done around it.

``fully_shard`` is applied bottom-up to the modules the wrap policy picks, then to the root,
so each picked block gathers its parameters just before its forward and frees them after.
A module is never picked when one of its parameters is also used outside it (tied weights,
such as an embedding shared with the output head): the two users would be in different shard
groups, so such parameters stay with the common ancestor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = [
    "CheckpointedForward",
    "IgnoredGradients",
    "ignored_parameters",
    "remap_optimizer",
    "wrap_targets",
]


def _policy_function(plugin: Any, model: nn.Module) -> Callable[[nn.Module], bool]:
    policy = plugin.auto_wrap_policy
    if callable(policy):
        return policy
    if policy == "no_wrap":
        return lambda module: False
    if policy == "size_based_wrap":
        return lambda module: sum(p.numel() for p in module.parameters()) >= plugin.min_num_params
    names = plugin.transformer_cls_names_to_wrap or list(
        getattr(model, "_no_split_modules", None) or []
    )
    if not names:
        raise ValueError(
            "auto_wrap_policy='transformer_based_wrap' needs the block classes to shard: give "
            "transformer_cls_names_to_wrap=['MyBlock'] (the model has no _no_split_modules)."
        )
    present = {type(module).__name__ for module in model.modules()}
    unknown = [name for name in names if name not in present]
    if unknown:
        raise ValueError(
            f"transformer_cls_names_to_wrap names {unknown}, which the model does not contain; "
            f"its module classes are: {', '.join(sorted(present))}."
        )
    return lambda module: type(module).__name__ in names


def _shared_outside(model: nn.Module) -> Callable[[str], bool]:
    """Whether the module at a name has a parameter that some module outside it also holds."""
    owners: dict[int, list[str]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for parameter in module.parameters(recurse=False):
            owners.setdefault(id(parameter), []).append(module_name)

    def shared(name: str) -> bool:
        prefix = f"{name}."
        for module_names in owners.values():
            inside = [m for m in module_names if m == name or m.startswith(prefix)]
            if inside and len(inside) != len(module_names):
                return True
        return False

    return shared


def wrap_targets(model: nn.Module, plugin: Any) -> list[nn.Module]:
    """The submodules to shard on their own, children before parents (root excluded).

    Example::

        [type(m).__name__ for m in wrap_targets(gpt, plugin)]
    """
    picks = _policy_function(plugin, model)
    shared = _shared_outside(model)
    # Containers without a forward of their own (ModuleList, ModuleDict) cannot be sharded.
    named = [
        (name, module)
        for name, module in model.named_modules()
        if name and not isinstance(module, (nn.ModuleList, nn.ModuleDict))
    ]
    chosen = [
        module
        for name, module in named
        if picks(module) and any(True for _ in module.parameters()) and not shared(name)
    ]
    return list(reversed(chosen))  # named_modules lists parents first


def ignored_parameters(
    model: nn.Module, ignored: Iterable[nn.Module] | str | None
) -> set[nn.Parameter]:
    """Parameters of ``ignored_modules`` (modules, or a regex matched against module names)."""
    if ignored is None:
        return set()
    if isinstance(ignored, str):
        pattern = re.compile(ignored)
        modules = [m for name, m in model.named_modules() if name and pattern.search(name)]
    else:
        modules = list(ignored)
    return {parameter for module in modules for parameter in module.parameters()}


class IgnoredGradients:
    """Averages the gradients of ``ignored_modules`` over the ranks, as DDP would.

    FSDP2 leaves ignored parameters alone: whole on every rank, plain tensors, and their
    gradients never reduced, so each rank would train its own copy on its own batches. Each
    such parameter gets a hook that all-reduces its gradient once it is accumulated, unless
    gradient sync is off (``no_sync``/``accumulate`` micro-steps, where FSDP2 waits too).
    Kept on the model (``_notebook_kit_ignored``), so a pool's later commands find it.
    """

    attribute = "_notebook_kit_ignored"

    def __init__(self, parameters: Iterable[nn.Parameter], group: Any, world_size: int) -> None:
        self.group = group
        self.world_size = world_size
        self.sync = True
        self.handles = [
            parameter.register_post_accumulate_grad_hook(self)
            for parameter in parameters
            if parameter.requires_grad
        ]

    def __call__(self, parameter: torch.Tensor) -> None:
        if self.sync and parameter.grad is not None:
            dist.all_reduce(parameter.grad, group=self.group)  # gloo has no AVG: sum, divide
            parameter.grad.div_(self.world_size)

    @classmethod
    def of(cls, model: nn.Module) -> IgnoredGradients | None:
        return model.__dict__.get(cls.attribute)


class CheckpointedForward:
    """A module's own forward whose activations are recomputed in backward (not kept).

    Set as an instance attribute, like mixed precision's forward, so module names and state
    dict keys stay as they were; non-reentrant checkpointing works with FSDP2's hooks.
    """

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.original = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(self.original, *args, use_reentrant=False, **kwargs)


def remap_optimizer(
    optimizer: torch.optim.Optimizer, before: dict[int, str], model: nn.Module
) -> bool:
    """Point ``optimizer`` at the sharded parameters that replaced the ones it was built with.

    ``before`` maps the id of each parameter before sharding to its name. Returns whether
    the optimizer held any of the model's parameters.
    """
    after = dict(model.named_parameters())
    if optimizer.state:
        raise ValueError(
            "The optimizer has already stepped: prepare the model and its optimizer with FSDP "
            "before the first optimizer step, so its state can be sharded with the parameters."
        )
    touched = False
    for group in optimizer.param_groups:
        params: Sequence[Any] = group["params"]
        renamed = []
        for parameter in params:
            name = before.get(id(parameter))
            touched |= name is not None
            renamed.append(after[name] if name is not None and name in after else parameter)
        group["params"] = renamed
    return touched
