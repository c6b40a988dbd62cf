"""notebook_kit: distributed PyTorch training from a Jupyter notebook."""

from notebook_kit.accelerator import Accelerator
from notebook_kit.accelerator_checkpoints import ProjectConfiguration
from notebook_kit.checkpointing import CheckpointError
from notebook_kit.config import LaunchConfig
from notebook_kit.data_loader import skip_first_batches
from notebook_kit.environment import environment
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
