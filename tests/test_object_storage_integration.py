"""Checkpoints on object storage: ``save_state``, ``load_state`` and ``save_model`` through
``s3://`` on a real S3-protocol server (moto's, on loopback, one per module), and a folder that
is not shared by every rank."""

from __future__ import annotations

import importlib.util
import os
import uuid
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from notebook_kit import (
    Accelerator,
    CheckpointError,
    ProjectConfiguration,
    WorkerError,
    notebook_launcher,
)
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, s3_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3() -> S3Server:
    # Not in the dev extra: with boto3's narrow pins, pip's resolver searched for over 15
    # minutes in a fresh environment. Install both to run these tests.
    needs = "needs s3fs and moto: pip install 'notebook_kit[s3]' 'moto[server]'"
    pytest.importorskip("s3fs", reason=needs)
    pytest.importorskip("moto", reason=needs)
    with s3_server() as server:
        yield server


@pytest.fixture
def bucket(s3: S3Server) -> str:
    return "s3://" + s3.make_bucket(f"nbk-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def endpoint_from_environment(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint where the AWS tools look for it, as a user's own configuration would say."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)


def _prepared(accelerator: Accelerator):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    data = TensorDataset(torch.arange(32.0).view(16, 2))
    loader = DataLoader(data, batch_size=2, shuffle=True)
    return accelerator.prepare(model, optimizer, loader)


def _train(accelerator, model, optimizer, batch) -> None:
    accelerator.backward(model(batch[0]).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


def _no_secret_in(s3: S3Server, bucket: str) -> None:
    filesystem = s3.filesystem()
    paths = filesystem.find(bucket.removeprefix("s3://"))
    assert paths, "nothing was written"
    for path in paths:
        content = filesystem.cat(path)
        assert SECRET_KEY.encode() not in content and ACCESS_KEY.encode() not in content, path


def test_numbered_checkpoints_on_s3_start_fresh_resume_and_keep_total_limit(s3, bucket):
    config = ProjectConfiguration(
        project_dir=f"{bucket}/run", total_limit=2, storage_options=s3.options
    )
    accelerator = Accelerator(project_config=config)
    model, optimizer, loader = _prepared(accelerator)
    assert accelerator.load_state() is None  # nothing saved yet: start fresh
    batches = iter(loader)
    for _ in range(3):
        _train(accelerator, model, optimizer, next(batches))
        saved = accelerator.save_state()
    expected_weight = model.weight.detach().clone()
    expected_next = next(batches)[0]

    listing = s3.filesystem().ls(f"{bucket.removeprefix('s3://')}/run/checkpoints")
    assert sorted(path.rsplit("/", 1)[1] for path in listing) == ["checkpoint_1", "checkpoint_2"]
    assert str(saved) == f"{bucket}/run/checkpoints/checkpoint_2"

    again = Accelerator(project_config=config)
    model2, _, loader2 = _prepared(again)
    with torch.no_grad():
        model2.weight.zero_()
    loaded = again.load_state()
    assert str(loaded) == f"{bucket}/run/checkpoints/checkpoint_2"
    assert torch.equal(model2.weight, expected_weight)
    assert torch.equal(next(iter(loader2))[0], expected_next)  # the data position came back
    _no_secret_in(s3, bucket)


def test_a_checkpoint_another_process_wrote_is_found_by_a_process_that_listed_before(s3, bucket):
    """A warm worker (a pool's, or a long run) lists the folder, another process then commits."""
    config = ProjectConfiguration(project_dir=f"{bucket}/run", storage_options=s3.options)
    accelerator = Accelerator(project_config=config)
    _prepared(accelerator)
    accelerator.save_state()
    assert str(accelerator.load_state()).endswith("checkpoint_0")  # listed: checkpoint_0 only
    other = s3.filesystem()  # another process's view: its own connection and caches
    checkpoints = f"{bucket.removeprefix('s3://')}/run/checkpoints"
    other.copy(f"{checkpoints}/checkpoint_0", f"{checkpoints}/checkpoint_1", recursive=True)
    assert str(accelerator.load_state()).endswith("checkpoint_1")


class _BreaksOnSave:
    """Registered for checkpointing; once armed, its state_dict raises (Ctrl-C mid-save)."""

    def __init__(self) -> None:
        self.armed = False

    def state_dict(self):
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return {"value": torch.tensor(1)}

    def load_state_dict(self, state) -> None:
        pass


def test_an_interrupted_or_killed_save_on_s3_is_never_loaded(s3, bucket):
    config = ProjectConfiguration(project_dir=f"{bucket}/run", storage_options=s3.options)
    accelerator = Accelerator(project_config=config)
    model, _, _ = _prepared(accelerator)
    breaker = _BreaksOnSave()
    accelerator.register_for_checkpointing(breaker)
    accelerator.save_state()
    good = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    breaker.armed = True
    with pytest.raises(KeyboardInterrupt):
        accelerator.save_state()  # model and optimizer files were written before it stopped
    root = f"{bucket.removeprefix('s3://')}/run/checkpoints"
    filesystem = s3.filesystem()
    assert [p.rsplit("/", 1)[1] for p in filesystem.ls(root)] == ["checkpoint_0"]

    # A save killed with no chance to clean up: a state folder with no manifest.
    filesystem.pipe(f"{root}/checkpoint_7/state-0123abcd/model_0.pt", b"half a file")
    assert str(accelerator.load_state()).endswith("checkpoint_0")
    assert torch.equal(model.weight, good)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert str(accelerator.save_state()).endswith("checkpoint_1")
    assert any("Removed" in str(w.message) and "checkpoint_7" in str(w.message) for w in caught)
    filesystem.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[1] for p in filesystem.ls(root)) == [
        "checkpoint_0",
        "checkpoint_1",
    ]


def test_a_url_without_its_backend_or_with_a_password_is_refused_before_saving(tmp_path):
    accelerator = Accelerator()
    _prepared(accelerator)
    backends = (("gs://bucket/run", "gcsfs", "gcs"), ("az://c/run", "adlfs", "azure"))
    for url, package, extra in backends:
        if importlib.util.find_spec(package) is not None:
            continue  # installed here: nothing to refuse
        needs = rf"needs {package}.*notebook_kit\[{extra}\]"
        with pytest.raises(ImportError, match=needs):
            accelerator.save_state(url)
        with pytest.raises(ImportError, match=needs):
            Accelerator(project_dir=url)  # before any training starts
    with pytest.raises(ValueError, match="fsspec knows no storage called 'nosuch'"):
        accelerator.save_state("nosuch://bucket/run")
    with pytest.raises(ValueError, match="carries a password") as refused:
        accelerator.save_state(f"s3://{ACCESS_KEY}:{SECRET_KEY}@bucket/run")
    assert SECRET_KEY not in str(refused.value)
    with pytest.raises(ValueError, match="storage_options= is for a URL"):
        accelerator.save_state(tmp_path / "ckpt", storage_options={"anon": True})
    assert not list(tmp_path.iterdir())


def _ddp_round_trip(url: str) -> dict[str, bool]:
    accelerator = Accelerator()
    model, optimizer, loader = _prepared(accelerator)
    batches = iter(loader)
    _train(accelerator, model, optimizer, next(batches))
    saved = accelerator.save_state(url)
    after_save = [next(batches)[0] for _ in range(2)]
    _train(accelerator, model, optimizer, after_save[0])
    _train(accelerator, model, optimizer, after_save[1])
    straight = model.module.weight.detach().clone()
    accelerator.load_state(saved)
    resumed_batches = iter(loader)
    again = [next(resumed_batches)[0] for _ in range(2)]
    _train(accelerator, model, optimizer, again[0])
    _train(accelerator, model, optimizer, again[1])
    return {
        "same data": all(torch.equal(a, b) for a, b in zip(after_save, again, strict=True)),
        "same weights": torch.equal(model.module.weight, straight),
    }


def test_two_ranks_save_and_resume_through_s3_with_credentials_from_the_environment(
    s3, bucket, endpoint_from_environment
):
    result = notebook_launcher(_ddp_round_trip, args=(f"{bucket}/ddp",), num_processes=2)
    assert result == {"same data": True, "same weights": True}
    names = {p.rsplit("/", 1)[1] for p in s3.filesystem().find(bucket.removeprefix("s3://"))}
    assert {"checkpoint.json", "process_0.pt", "process_1.pt", "model_0.pt"} <= names
    _no_secret_in(s3, bucket)


def test_sharded_and_full_fsdp2_checkpoints_and_save_model_through_s3(
    s3, bucket, endpoint_from_environment
):
    from tests.test_fsdp_integration import _resume_checks

    results, _ = notebook_launcher(_resume_checks, args=(f"{bucket}/fsdp",), num_processes=2)
    assert results == {"SHARDED_STATE_DICT": True, "FULL_STATE_DICT": True}
    found = s3.filesystem().find(bucket.removeprefix("s3://") + "/fsdp")
    assert any(p.endswith("pytorch_model_fsdp_0/.metadata") for p in found)
    assert any(p.endswith("optimizer_0/.metadata") for p in found)
    assert any(p.endswith("model/model.safetensors.index.json") for p in found)


def _save_into_own_folder(base: str) -> str:
    """Each rank in a folder of its own, as each machine of a cluster has its own disk."""
    import torch.distributed as dist

    own = os.path.join(base, f"machine_{dist.get_rank()}")
    os.makedirs(own)
    os.chdir(own)
    accelerator = Accelerator()
    _prepared(accelerator)
    accelerator.save_state("ckpt")  # a relative path: a different folder on each "machine"
    return "saved"


def test_a_folder_that_is_not_shared_by_every_rank_is_refused_at_the_first_save(tmp_path):
    with pytest.raises(WorkerError, match="is not one folder shared by every rank") as failed:
        notebook_launcher(_save_into_own_folder, args=(str(tmp_path),), num_processes=2)
    assert "s3://" in str(failed.value) and "NFS" in str(failed.value)
    assert not list(tmp_path.rglob("checkpoint.json"))  # nothing was committed anywhere
    assert not list(tmp_path.rglob("model_0.pt"))  # refused before the large files
    assert CheckpointError.__name__ in str(failed.value)
