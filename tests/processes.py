"""Starting processes in tests: the ``notebook-kit launch`` command, free ports, environments."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "notebook_kit", "launch"]


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def clean_environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without a saved default config or scheduler variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "COILED_", "PET_"))}
    env.pop("OMP_NUM_THREADS", None)
    return {**env, "NOTEBOOK_KIT_CONFIG": str(tmp_path / "none.json"), **extra}


def kernel_environment() -> dict[str, str]:
    """Environment for a Jupyter kernel started by a test.

    ipykernel stops forwarding fd-level output when PYTEST_CURRENT_TEST is set.
    """
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env
