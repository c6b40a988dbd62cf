"""Seeding and capturing every random number generator a training step may draw from."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["get_rng_states", "set_rng_states", "set_seed", "synchronize_rng_states"]


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy and torch (CPU and every CUDA device).

    Args:
        seed: The seed.
        device_specific: Add the process's rank to ``seed``, so processes draw different
            numbers (e.g. different augmentations) yet stay reproducible.
        deterministic: Also ask torch for deterministic algorithms (may be slower).

    Example:
        >>> set_seed(42)
        >>> torch.rand(1).item() == (set_seed(42) or torch.rand(1).item())
        True
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}.")
    if device_specific and dist.is_available() and dist.is_initialized():
        seed += dist.get_rank()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    # Lazy: only queued until CUDA is used, so this never initialises CUDA before a fork.
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def get_rng_states() -> dict[str, Any]:
    """This process's generator states, made only of types ``torch.load(weights_only=True)`` reads.

    Example::

        states = get_rng_states(); torch.rand(1); set_rng_states(states)
    """
    version, python_state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "python": {"version": version, "state": list(python_state), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    # Reading CUDA states would initialise CUDA; only do it where CUDA is already in use.
    # is_initialized() first: without NVML counting (MIG) is_available() initialises CUDA.
    if torch.cuda.is_initialized() and torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_states` captured.

    Example:
        >>> set_rng_states(get_rng_states())
    """
    python = states["python"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss"]))
    numpy = states["numpy"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state(
        (numpy["kind"], keys, numpy["position"], numpy["has_gauss"], numpy["cached"])
    )
    torch.set_rng_state(states["torch"])
    # Only where CUDA is in use: is_available() itself may initialise CUDA (under MIG), which
    # in a kernel would refuse every later fork.
    if "cuda" in states and torch.cuda.is_initialized():
        torch.cuda.set_rng_state_all(states["cuda"])


def _from_rank_zero(state: torch.Tensor) -> torch.Tensor:
    box = [state]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def synchronize_rng_states(rng_types: list[str], generator: torch.Generator | None = None) -> None:
    """Give every process rank 0's state of the named generators (no-op on one process).

    Args:
        rng_types: Any of ``"torch"`` (the global CPU generator), ``"cuda"`` (the current
            GPU's, when CUDA is in use) and ``"generator"`` (``generator``).
        generator: The generator ``"generator"`` refers to.

    Example:
        >>> synchronize_rng_states(["torch"])  # every rank now draws the same numbers
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for kind in rng_types:
        kind = str(getattr(kind, "value", kind))
        if kind == "torch":
            torch.set_rng_state(_from_rank_zero(torch.get_rng_state()))
        elif kind == "cuda":
            if torch.cuda.is_initialized() and torch.cuda.is_available():
                torch.cuda.set_rng_state(_from_rank_zero(torch.cuda.get_rng_state()))
        elif kind == "generator":
            if generator is None:
                raise ValueError('synchronize_rng_states(["generator"]) needs generator=.')
            generator.set_state(_from_rank_zero(generator.get_state()))
        else:
            raise ValueError(f"rng_types may hold 'torch', 'cuda' and 'generator'; got {kind!r}.")
