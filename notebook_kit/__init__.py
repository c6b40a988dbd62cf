"""notebook_kit: distributed PyTorch training from a Jupyter notebook.

The public names are imported on first use (PEP 562), so a light entry point such as the
``notebook-kit`` command does not pay for torch or ipywidgets until it needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Eager on purpose: ``notebook_kit.environment`` is also a submodule, and importing a submodule
# the first time sets the package attribute of that name to the module. Importing it here,
# before anything else can, keeps the attribute bound to the function.
from notebook_kit.environment import environment

if TYPE_CHECKING:
    from notebook_kit.accelerator import Accelerator
    from notebook_kit.accelerator_checkpoints import ProjectConfiguration
    from notebook_kit.checkpointing import CheckpointError
    from notebook_kit.config import LaunchConfig
    from notebook_kit.data_loader import skip_first_batches
    from notebook_kit.errors import PortInUseError, WorkerError
    from notebook_kit.launcher import notebook_launcher, notebook_launcher_async
    from notebook_kit.panel import ConfigPanel
    from notebook_kit.preflight import ForkSafetyError
    from notebook_kit.record import RunRecord, last_run
    from notebook_kit.seeding import set_seed

__all__ = [
    "Accelerator",
    "CheckpointError",
    "ConfigPanel",
    "ForkSafetyError",
    "LaunchConfig",
    "PortInUseError",
    "ProjectConfiguration",
    "RunRecord",
    "WorkerError",
    "environment",
    "last_run",
    "notebook_launcher",
    "notebook_launcher_async",
    "set_seed",
    "skip_first_batches",
]

__version__ = "0.1.0"

# Public name -> the submodule that defines it.
_LAZY: dict[str, str] = {
    "Accelerator": "accelerator",
    "CheckpointError": "checkpointing",
    "ConfigPanel": "panel",
    "ForkSafetyError": "preflight",
    "LaunchConfig": "config",
    "PortInUseError": "errors",
    "ProjectConfiguration": "accelerator_checkpoints",
    "RunRecord": "record",
    "WorkerError": "errors",
    "last_run": "record",
    "notebook_launcher": "launcher",
    "notebook_launcher_async": "launcher",
    "set_seed": "seeding",
    "skip_first_batches": "data_loader",
}


def __getattr__(name: str) -> Any:
    """Import a public name from its submodule on first access and keep it."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Module attributes plus the public names not imported yet."""
    return sorted({*globals(), *__all__})
