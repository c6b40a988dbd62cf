"""Accelerate's own configuration objects, read field by field into notebook_kit's.

A script ported by changing only ``from accelerate import Accelerator`` still builds
``accelerate.utils.DataLoaderConfiguration(...)``, ``GradientAccumulationPlugin(...)``,
``ProjectConfiguration(...)`` and kwargs handlers such as ``DistributedDataParallelKwargs``.
Each is taken as the notebook_kit class of the same name: every field notebook_kit has is
copied; a field it lacks is fine at Accelerate's default and an error naming it otherwise,
never silently dropped. Nothing here imports Accelerate: its objects are recognised by their
class (a dataclass defined in an ``accelerate`` module, with the same name).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, TypeVar

__all__ = ["adopt", "is_accelerates"]

T = TypeVar("T")


def is_accelerates(value: Any, name: str | None = None) -> bool:
    """Whether ``value`` is a configuration object of Accelerate's (named ``name``).

    Example:
        >>> from accelerate.utils import ProjectConfiguration
        >>> is_accelerates(ProjectConfiguration(), "ProjectConfiguration")
        True
    """
    cls = type(value)
    return (
        dataclasses.is_dataclass(cls)
        and cls.__module__.partition(".")[0] == "accelerate"
        and (name is None or cls.__name__ == name)
    )


def adopt(value: Any, ours: type[T], parameter: str) -> Any:
    """``value`` as ``ours`` when it is Accelerate's class of that name; else unchanged.

    Args:
        value: What the user passed.
        ours: The notebook_kit dataclass to build.
        parameter: The Accelerator argument it came through, for the error message.

    Raises:
        ValueError: The object sets a field notebook_kit does not support.

    Example:
        >>> from accelerate.utils import DataLoaderConfiguration as Theirs
        >>> from notebook_kit import DataLoaderConfiguration
        >>> config = adopt(Theirs(even_batches=False), DataLoaderConfiguration, "dataloader_config")
        >>> config.even_batches, type(config).__module__
        (False, 'notebook_kit.accelerator.configuration')
    """
    if isinstance(value, ours) or not is_accelerates(value, ours.__name__):
        return value
    mine = {field.name: field for field in dataclasses.fields(ours)}  # type: ignore[arg-type]
    copied: dict[str, Any] = {}
    for field in dataclasses.fields(value):
        given = getattr(value, field.name)
        if field.name in mine:
            copied[field.name] = _ours_of(given, mine[field.name])
            continue
        default = _default(field)
        if default is dataclasses.MISSING or given != default:
            name = type(value).__name__
            raise ValueError(
                f"{parameter}: notebook_kit does not support {name}.{field.name} "
                f"(got {given!r}); leave it at Accelerate's default ({default!r}) or remove it. "
                f"Supported fields: {', '.join(mine)}."
            )
    return ours(**copied)


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _ours_of(value: Any, field: dataclasses.Field[Any]) -> Any:
    """An Accelerate enum member becomes ours of the same value (``DDPCommunicationHookType``)."""
    default = _default(field)
    if isinstance(value, enum.Enum) and isinstance(default, enum.Enum):
        return type(default)(value.value)
    return value
