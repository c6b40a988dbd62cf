"""A LaunchConfig as ``notebook-kit launch`` flags: the one spelling the command, the panel's
rendered command and error messages share."""

from __future__ import annotations

import shlex
from typing import Any

from notebook_kit.config.launch_config import LaunchConfig
from notebook_kit.config.schema import SETTINGS

__all__ = ["answer_text", "launch_command_line", "option_name"]


def option_name(field: str) -> str:
    """The command-line flag for a LaunchConfig field: ``num_processes`` -> ``--num-processes``."""
    return SETTINGS[field].flag


def launch_command_line(
    config: LaunchConfig, script: str = "train.py", baseline: LaunchConfig | None = None
) -> str:
    """The ``notebook-kit launch`` command that runs ``script`` with ``config``.

    A flag is written for every field that differs from the built-in defaults or from
    ``baseline`` (what a run on this machine falls back to, usually the saved default), so the
    command means the same here and on a machine without a saved default.

    Example:
        >>> launch_command_line(LaunchConfig(num_processes=2))
        'notebook-kit launch --num-processes 2 train.py'
    """
    builtin = LaunchConfig()
    words = ["notebook-kit", "launch"]
    for field in SETTINGS:
        value = getattr(config, field)
        if value == getattr(builtin, field) and (
            baseline is None or value == getattr(baseline, field)
        ):
            continue
        setting = SETTINGS[field]
        if setting.switch:
            words.append(setting.flag if value else setting.off_flag)
        else:
            words += [option_name(field), answer_text(value)]
    words.append(script)
    return " ".join(shlex.quote(word) for word in words)


def answer_text(value: Any) -> str:
    """A value as a person types it (and as parse_text reads it back)."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
