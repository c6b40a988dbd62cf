"""Checkpoints on object storage: ``save_state``, ``load_state`` and ``save_model`` through
``s3://`` on a real S3-protocol server (moto's, on loopback, one per module), and a folder that
is not shared by every rank."""

from __future__ import annotations

import importlib.util
import os
import socket
import time
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
from notebook_kit.accelerator.checkpoint_files import CheckpointSaveError
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, s3_server
from tests.silent_storage import Relay, silent_endpoint

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
    left = [path.relative_to(tmp_path) for path in tmp_path.rglob("*")]
    assert sorted(map(str, left)) == ["machine_0", "machine_1"]  # no folder, no marker


# A bound that proves "fails, does not hang": storage_timeout is 5 s in these tests, the
# default 60 s, and before it a silent S3 blocked one save for 408 s.
_BOUNDED = 30


def test_storage_that_stops_answering_fails_each_save_in_bounded_time_keeping_the_last(
    s3, bucket, monkeypatch
):
    relay = Relay(s3.endpoint)
    options = {"client_kwargs": {"endpoint_url": relay.endpoint}}
    config = ProjectConfiguration(project_dir=f"{bucket}/run", storage_options=options)
    accelerator = Accelerator(project_config=config)
    model, _, _ = _prepared(accelerator)
    accelerator.save_state()  # with the default bound: on two busy cores a first save is slow
    saved = model.weight.detach().clone()
    monkeypatch.setenv("NOTEBOOK_KIT_STORAGE_TIMEOUT", "5")
    relay.fall_silent()
    for target, async_save in ((None, False), (f"{bucket}/named", False), (None, True)):
        started = time.monotonic()
        with pytest.raises(CheckpointSaveError) as failed:
            where = accelerator.save_state(
                target, storage_options=target and options, async_save=async_save
            )
            accelerator.wait_for_everyone()
            accelerator.save_state(where)  # an async save's failure is raised at the next
        assert time.monotonic() - started < _BOUNDED
        assert f"{bucket}/" in str(failed.value) and "gave no answer for 5 s" in str(failed.value)
    relay.close()
    direct = ProjectConfiguration(project_dir=f"{bucket}/run", storage_options=s3.options)
    again = Accelerator(project_config=direct)
    model, _, _ = _prepared(again)
    with torch.no_grad():
        model.weight.zero_()
    assert str(again.load_state()).endswith("checkpoint_0")
    assert torch.equal(model.weight, saved)


def _save_and_report(url: str, endpoint: str) -> list[str]:
    """Every rank's outcome of one save to ``url``, gathered on rank 0."""
    from notebook_kit.accelerator.operations import gather_object

    accelerator = Accelerator()
    _prepared(accelerator)
    options = {"client_kwargs": {"endpoint_url": endpoint}}
    try:
        accelerator.save_state(url, storage_options=options)
        outcome = "saved"
    except CheckpointSaveError as error:
        outcome = f"{type(error).__name__}: {error}"
    return gather_object([outcome])


def test_two_ranks_saving_to_storage_that_never_answers_both_raise_within_the_bound(s3):
    with silent_endpoint() as endpoint:
        started = time.monotonic()
        outcomes = notebook_launcher(
            _save_and_report, args=("s3://quiet/run", endpoint), num_processes=2, storage_timeout=5
        )
    assert time.monotonic() - started < _BOUNDED + 20  # two processes start, too
    assert len(outcomes) == 2
    for outcome in outcomes:
        assert outcome.startswith("CheckpointSaveError") and "s3://quiet/run" in outcome
        assert "gave no answer for 5 s" in outcome


def test_a_missing_bucket_is_named_and_never_created(s3):
    accelerator = Accelerator()
    model, _, _ = _prepared(accelerator)
    missing = f"nbk-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(CheckpointError, match=f"bucket .*'{missing}' does not exist"):
        accelerator.save_state(f"s3://{missing}/run", storage_options=s3.options)
    with pytest.raises(CheckpointError, match=f"bucket .*'{missing}' does not exist"):
        accelerator.save_model(model, f"s3://{missing}/model", storage_options=s3.options)
    assert not s3.filesystem().exists(missing)


def test_credentials_set_after_a_failed_save_are_used_by_the_next_one(s3, bucket, monkeypatch):
    from s3fs import S3FileSystem

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    S3FileSystem.clear_instance_cache()  # as in a kernel whose first save had no credentials
    config = ProjectConfiguration(project_dir=f"{bucket}/run", storage_options=s3.options)
    accelerator = Accelerator(project_config=config)
    _prepared(accelerator)
    for target in (None, f"{bucket}/named"):
        with pytest.raises(CheckpointSaveError, match="NoCredentialsError"):
            accelerator.save_state(target, storage_options=target and s3.options)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)  # as a user sets them in the kernel
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    assert str(accelerator.save_state()).endswith("checkpoint_0")
    assert str(accelerator.save_state(f"{bucket}/named", storage_options=s3.options))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_sharded_checkpoint_on_s3_goes_where_storage_options_say(s3, bucket, monkeypatch):
    """torch's sharded writer and reader get the options; the environment names no endpoint."""
    import torch.distributed.checkpoint as dcp

    from notebook_kit.accelerator.storage import dcp_options, storage_path

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    where = storage_path(f"{bucket}/sharded", s3.options)
    state = {"weight": torch.arange(6.0).view(2, 3)}
    dcp.save(state, **dcp_options(where, writing=True))
    loaded = {"weight": torch.zeros(2, 3)}
    dcp.load(loaded, **dcp_options(where, writing=False))
    assert torch.equal(loaded["weight"], state["weight"])


def test_a_refused_connection_is_a_checkpoint_save_error_naming_the_url(s3):
    with socket.socket() as closed:  # a port nothing listens on: every connection is refused
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    accelerator = Accelerator()
    _prepared(accelerator)
    options = {"client_kwargs": {"endpoint_url": endpoint}}
    with pytest.raises(CheckpointSaveError, match=r"s3://any/run.*EndpointConnectionError"):
        accelerator.save_state("s3://any/run", storage_options=options)
