"""Skip markers for tests that need an optional package: the reason names it and its install."""

from __future__ import annotations

import importlib.util

import pytest

_INSTALL = {
    "transformers": "pip install notebook_kit[transformers]",
    "accelerate": "pip install accelerate",
    "tensorboard": "pip install tensorboard",
    "wandb": "pip install notebook_kit[wandb]",
    "mlflow": "pip install notebook_kit[mlflow]",
    "dask_jobqueue": "pip install notebook_kit[slurm]",
}


def needs(*packages: str, what: str = "this test") -> pytest.MarkDecorator:
    """Skip unless every one of ``packages`` is installed; ``what`` says what needs them."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    installs = "; ".join(_INSTALL.get(name, f"pip install {name}") for name in missing)
    return pytest.mark.skipif(
        bool(missing), reason=f"{what} needs {' and '.join(missing)} ({installs})"
    )


needs_transformers = needs("transformers")
needs_accelerate = needs("accelerate")
needs_tensorboard = needs("tensorboard")
needs_wandb = needs("wandb")
needs_mlflow = needs("mlflow")
