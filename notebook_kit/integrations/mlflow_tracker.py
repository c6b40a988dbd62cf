"""``MLflowTracker``: an MLflow run for notebook_kit's ``Accelerator``.

Same name and arguments as Accelerate's tracker; the experiment is created if missing. The
tracking server is MLflow's own choice (``MLFLOW_TRACKING_URI``; by default ``./mlruns``). An
``MlflowClient`` of its own leaves the user's ``mlflow.start_run()`` state alone.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from notebook_kit.integrations.named_trackers import NamedTracker

__all__ = ["MLflowTracker"]

_BATCH = 100  # params or metrics per request: MLflow's limit for params and tags


class MLflowTracker(NamedTracker):
    """Logs metrics and parameters to an MLflow run.

    Args:
        experiment_name: The experiment (``init_trackers``' ``project_name``);
            ``MLFLOW_EXPERIMENT_NAME`` wins, as in Accelerate.
        logging_dir: The artifact location of a newly created experiment.
        run_id: Log into this existing run instead (``MLFLOW_RUN_ID`` wins).
        tags: Tags of the run (a dict, or its JSON; ``MLFLOW_TAGS`` wins).
        nested_run: Accepted for Accelerate compatibility (a client-made run has no parent).
        run_name: The new run's name.
        description: The run's description.

    Example::

        accelerator = Accelerator(log_with="mlflow")
        accelerator.init_trackers("digits", config={"lr": 0.01},
                                  init_kwargs={"mlflow": {"run_name": "first try"}})
        accelerator.log({"loss": 0.5}, step=1)
    """

    name = "mlflow"

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool | None = False,
        run_name: str | None = None,
        description: str | None = None,
    ) -> None:
        tags = os.environ.get("MLFLOW_TAGS", tags)
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = None if logging_dir is None else str(logging_dir)
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        self.tags = {
            str(k): str(v)
            for k, v in (json.loads(tags) if isinstance(tags, str) else tags or {}).items()
        }
        self.nested_run = nested_run
        self.run_name = run_name
        self.description = description
        self.client: Any = None

    @property
    def tracker(self) -> Any:
        """The MLflow run (``mlflow.entities.Run``), after ``start``."""
        return None if self.client is None else self.client.get_run(self.run_id)

    def start(self) -> None:
        self.client = self._package("mlflow.tracking").MlflowClient()
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")
            for key, value in self.tags.items():
                self.client.set_tag(self.run_id, key, value)
            return
        name = self.experiment_name or "Default"
        found = self.client.get_experiment_by_name(name)
        experiment = (
            found.experiment_id
            if found is not None
            else self.client.create_experiment(name, artifact_location=self.logging_dir)
        )
        tags = dict(self.tags)
        if self.description:
            tags["mlflow.note.content"] = self.description
        run = self.client.create_run(experiment, tags=tags, run_name=self.run_name)
        self.run_id = run.info.run_id

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """The run's configuration, as MLflow parameters (longer values are left out)."""
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        params = [
            Param(str(key), str(value))
            for key, value in values.items()
            if len(str(value)) <= MAX_PARAM_VAL_LENGTH
        ]
        for start in range(0, len(params), _BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + _BATCH])

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as metrics at ``step`` (other values are not metrics in MLflow)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(str(key), float(value), now, step or 0)
            for key, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        for start in range(0, len(metrics), _BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + _BATCH])

    def finish(self) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id)
