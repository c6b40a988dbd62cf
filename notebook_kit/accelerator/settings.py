"""Turning the Accelerator's constructor arguments into its configuration objects.

Accelerate ≥ 1.0 takes data loader and accumulation settings through ``DataLoaderConfiguration``
and ``GradientAccumulationPlugin``; the older keyword spellings (``split_batches=``,
``even_batches=``, ``gradient_accumulation_steps=``) are still accepted here, but not together
with the object that holds the same setting. Accelerate's own objects are read field by field
(:mod:`notebook_kit.accelerator.accelerate_objects`).
"""

from __future__ import annotations

from typing import Any

from notebook_kit.accelerator.accelerate_objects import adopt
from notebook_kit.accelerator.configuration import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
)

__all__ = [
    "RNG_TYPES",
    "accumulation_plugin",
    "check_choice",
    "check_flag",
    "check_rng_types",
    "check_steps",
    "loader_configuration",
]

RNG_TYPES: tuple[str, ...] = ("generator", "torch", "cuda")


def check_flag(name: str, value: Any) -> bool:
    """``value`` if it is a bool, else a ValueError naming ``name``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}.")
    return value


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> Any:
    """``value`` if it is one of ``choices``, else a ValueError listing them."""
    if value not in choices:
        allowed = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")
    return value


def check_steps(value: Any) -> int | None:
    """A gradient accumulation step count (an integer >= 1) or None."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {value!r}.")
    return value


def loader_configuration(
    config: DataLoaderConfiguration | None, split_batches: bool | None, even_batches: bool | None
) -> DataLoaderConfiguration:
    """The Accelerator's ``DataLoaderConfiguration`` from the object or the older keywords.

    Example:
        >>> loader_configuration(None, True, None).split_batches
        True
    """
    given = {
        name: check_flag(name, value)
        for name, value in (("split_batches", split_batches), ("even_batches", even_batches))
        if value is not None
    }
    if config is None:
        return DataLoaderConfiguration(**given)
    config = adopt(config, DataLoaderConfiguration, "dataloader_config")
    if not isinstance(config, DataLoaderConfiguration):
        raise TypeError(
            f"dataloader_config must be a notebook_kit DataLoaderConfiguration, got "
            f"{type(config).__module__}.{type(config).__name__}."
        )
    if given:
        names = " and ".join(given)
        raise ValueError(
            f"Pass {names} inside dataloader_config, not next to it: "
            f"DataLoaderConfiguration({', '.join(f'{k}={v}' for k, v in given.items())})."
        )
    return config


def accumulation_plugin(
    plugin: GradientAccumulationPlugin | None, steps: int | None
) -> GradientAccumulationPlugin:
    """The accumulation settings from the plugin or from ``gradient_accumulation_steps``.

    Example:
        >>> accumulation_plugin(None, 4).num_steps
        4
    """
    if plugin is None:
        return GradientAccumulationPlugin(num_steps=steps)
    plugin = adopt(plugin, GradientAccumulationPlugin, "gradient_accumulation_plugin")
    if not isinstance(plugin, GradientAccumulationPlugin):
        raise TypeError(
            f"gradient_accumulation_plugin must be a notebook_kit GradientAccumulationPlugin, "
            f"got {type(plugin).__module__}.{type(plugin).__name__}."
        )
    if steps is not None and steps != plugin.num_steps:
        raise ValueError(
            "Pass only one of gradient_accumulation_steps and gradient_accumulation_plugin; "
            "set GradientAccumulationPlugin(num_steps=...) instead."
        )
    return plugin


def check_rng_types(rng_types: Any) -> list[str]:
    """``rng_types`` checked against the generators that can be synchronised (default: sampler's).

    Example:
        >>> check_rng_types(None)
        ['generator']
    """
    if rng_types is None:
        return ["generator"]
    names = [str(getattr(kind, "value", kind)) for kind in rng_types]
    unknown = [name for name in names if name not in RNG_TYPES]
    if unknown:
        allowed = ", ".join(repr(name) for name in RNG_TYPES)
        raise ValueError(f"rng_types may hold {allowed}; got {unknown}.")
    return names
