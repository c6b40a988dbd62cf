"""``WandBTracker``: a Weights & Biases run for notebook_kit's ``Accelerator``.

Same name and arguments as Accelerate's tracker: ``log_with="wandb"`` and
``init_trackers("my-project", config=..., init_kwargs={"wandb": {...}})`` start
``wandb.init(project="my-project", **init_kwargs["wandb"])`` on the main process, store
``config`` as the run's config and log every ``accelerator.log`` call at its step. Needs the
``wandb`` package (``pip install notebook_kit[wandb]``); ``WANDB_MODE=offline`` keeps the run on
disk (``wandb sync`` uploads it later).
"""

from __future__ import annotations

from typing import Any

__all__ = ["WandBTracker"]


class WandBTracker:
    """Logs metrics to a Weights & Biases run.

    Args:
        run_name: The W&B project (``init_trackers``' ``project_name``).
        **kwargs: Passed on to ``wandb.init`` (``name``, ``entity``, ``tags``, ``dir``, ...).

    Example::

        accelerator = Accelerator(log_with="wandb")
        accelerator.init_trackers("digits", config={"lr": 0.01},
                                  init_kwargs={"wandb": {"name": "first try"}})
        accelerator.log({"loss": 0.5}, step=1)
    """

    name = "wandb"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    @property
    def tracker(self) -> Any:
        """The ``wandb`` run (after ``start``)."""
        return self.run

    def start(self) -> None:
        try:
            import wandb
        except ImportError as error:
            raise ImportError(
                'log_with="wandb" needs the wandb package: pip install wandb '
                "(or pip install notebook_kit[wandb])."
            ) from error
        self.run = wandb.init(project=self.run_name, **self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """The run's configuration (W&B's config panel)."""
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
