"""The Accelerator's configuration objects, with Accelerate's names and fields."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ProjectConfiguration"]


@dataclass
class ProjectConfiguration:
    """Where numbered checkpoints go and how many are kept, as in Accelerate.

    Attributes:
        project_dir: Folder holding ``checkpoints/checkpoint_<n>``.
        automatic_checkpoint_naming: Accepted for Accelerate compatibility; ``save_state()``
            without a directory always writes the next numbered checkpoint.
        total_limit: Keep only the newest this many numbered checkpoints (None: keep all).
        logging_dir: Where trackers such as ``log_with="tensorboard"`` write (default:
            ``project_dir``).

    Example:
        >>> config = ProjectConfiguration("runs/a", automatic_checkpoint_naming=True, total_limit=2)
        >>> accelerator = Accelerator(project_config=config)
    """

    project_dir: str | os.PathLike[str] | None = None
    automatic_checkpoint_naming: bool = True
    total_limit: int | None = None
    logging_dir: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        limit = self.total_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"total_limit must be a positive integer or None, got {limit!r}.")
        if limit is not None and limit < 1:
            raise ValueError(f"total_limit must be a positive integer or None, got {limit}.")
