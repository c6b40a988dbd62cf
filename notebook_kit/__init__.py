"""notebook_kit: distributed PyTorch training from a Jupyter notebook."""

from notebook_kit.config import LaunchConfig
from notebook_kit.environment import environment
from notebook_kit.errors import PortInUseError, WorkerError
from notebook_kit.launcher import notebook_launcher
from notebook_kit.panel import ConfigPanel
from notebook_kit.preflight import ForkSafetyError

__all__ = [
    "ConfigPanel",
    "ForkSafetyError",
    "LaunchConfig",
    "PortInUseError",
    "WorkerError",
    "environment",
    "notebook_launcher",
]

__version__ = "0.1.0"
