"""What Dask's nanny tunes in the environment of the worker it starts (none of it for a node).

A leaf of the node package: the neutral node environment (:mod:`notebook_kit.node.probe`)
takes these presets back out, on any engine's worker.

Runs in an engine's worker process.
"""

from __future__ import annotations

from typing import Any

__all__ = ["nanny_presets"]


def nanny_presets() -> dict[str, str]:
    """What Dask's nanny puts in the environment of the worker it starts.

    A ``LocalCluster`` runs its nannies in the calling process and sets them in that process's
    own environment too, so a Ray instance the kernel starts afterwards, and its workers, have
    them. A Ray worker has not imported ``distributed``, whose defaults file declares them:
    they are read from that file.
    """
    try:
        import dask

        presets = dask.config.get("distributed.nanny.pre-spawn-environ", default=None)
        if presets is None:
            presets = _distributed_defaults()["distributed"]["nanny"]["pre-spawn-environ"]
    except Exception:  # no dask, or no distributed: no nanny put anything here
        return {}
    return {str(name): str(value) for name, value in (presets or {}).items() if value is not None}


def _distributed_defaults() -> dict[str, Any]:
    """``distributed``'s defaults file, read without importing ``distributed``."""
    import importlib.util
    from pathlib import Path

    import yaml

    spec = importlib.util.find_spec("distributed")
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("distributed is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    return yaml.safe_load((folder / "distributed.yaml").read_text())
