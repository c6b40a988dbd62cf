"""``log_with="wandb"`` and ``"mlflow"`` in a real two-process launch, offline: the run each
service keeps is read back (W&B's offline run file, MLflow's client on a local ``file:`` store)
and holds what the main process logged, once; the live record has it too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from notebook_kit import Accelerator, last_run, notebook_launcher
from tests.optional import needs_mlflow, needs_wandb
from tests.wandb_records import records

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]

STEPS = 5


def _train(folder: str) -> int:
    accelerator = Accelerator(log_with=["wandb", "mlflow"])
    accelerator.init_trackers(
        "digits",
        config={"lr": 0.1, "layers": 2},
        init_kwargs={"wandb": {"dir": folder, "name": "first"}, "mlflow": {"run_name": "first"}},
    )
    for step in range(STEPS):
        accelerator.log({"loss": 1.0 / (step + 1) + accelerator.process_index}, step=step)
    accelerator.end_training()
    return accelerator.process_index


def _wandb_run(folder: Path) -> dict[str, Any]:
    (run_file,) = folder.glob("wandb/offline-run-*/run-*.wandb")  # one run: the main process's
    history, config, names = [], {}, []
    for record in records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {_key(item): item.value_json for item in record.history.item}
            history.append((int(items["_step"]), float(items["loss"])))
        elif kind == "config":
            config.update({_key(item): item.value_json for item in record.config.update})
        elif kind == "run":
            names.append((record.run.project, record.run.display_name))
    return {"history": history, "config": config, "names": names}


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _mlflow_run(store: str) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    losses = client.get_metric_history(run.info.run_id, "loss")
    return {
        "history": [(metric.step, metric.value) for metric in losses],
        "params": run.data.params,
        "name": run.info.run_name,
        "status": run.info.status,
    }


@needs_wandb
@needs_mlflow
def test_wandb_and_mlflow_keep_what_the_main_process_logged_and_the_plot_gets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f"file:{tmp_path / 'mlruns'}"
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "MLFLOW_TRACKING_URI": store,
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3 asks for this to use a local folder
    }.items():
        monkeypatch.setenv(name, value)
    assert notebook_launcher(_train, args=(str(tmp_path),), num_processes=2, live=False) == 0
    rank0 = [(step, 1.0 / (step + 1)) for step in range(STEPS)]
    wandb_run = _wandb_run(tmp_path)
    assert wandb_run["history"] == rank0
    assert wandb_run["config"] == {"lr": "0.1", "layers": "2"}
    assert wandb_run["names"] == [("digits", "first")]
    mlflow_run = _mlflow_run(store)
    assert mlflow_run["history"] == rank0
    assert mlflow_run["params"] == {"lr": "0.1", "layers": "2"}
    assert (mlflow_run["name"], mlflow_run["status"]) == ("first", "FINISHED")
    record = last_run()
    assert record is not None
    assert record.metrics["loss"] == [(step, 1.0 / (step + 1) + 0.5) for step in range(STEPS)]
