"""LaunchConfig: validation, the JSON file, the saved default and precedence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from notebook_kit.config.launch_config import (
    LaunchConfig,
    default_config_path,
    field_errors,
    resolve_launch_config,
    saved_default,
)
from notebook_kit.config.schema import parse_text as parse_field
from tests.configs import EVERY_FIELD_SET

pytestmark = pytest.mark.usefixtures("config_file")


def test_builtin_defaults_mean_auto_where_none() -> None:
    config = LaunchConfig()
    assert config.num_processes is None
    assert config.mixed_precision == "no"
    assert config.backend is None
    assert config.master_addr == "127.0.0.1"
    assert (config.num_nodes, config.node_rank, config.max_restarts) == (1, 0, 0)
    assert config.live is None


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"num_processes": "two"}, TypeError, ["num_processes", "integer >= 1"]),
        ({"num_processes": 0}, ValueError, ["num_processes", "integer >= 1", "got 0"]),
        ({"num_processes": True}, TypeError, ["num_processes"]),
        ({"mixed_precision": "fp32"}, ValueError, ["mixed_precision", "'no', 'fp16', 'bf16'"]),
        ({"backend": "mpi"}, ValueError, ["backend", "'auto', 'gloo', 'nccl'"]),
        ({"gradient_accumulation_steps": 0}, ValueError, ["gradient_accumulation_steps"]),
        ({"seed": -1}, ValueError, ["seed", "from 0 to 4294967295"]),
        ({"seed": 1.5}, TypeError, ["seed", "float"]),
        ({"master_port": 70000}, ValueError, ["master_port", "from 1 to 65535"]),
        ({"master_addr": ""}, ValueError, ["master_addr", "host name"]),
        ({"master_addr": "a b"}, ValueError, ["master_addr"]),
        ({"live": "yes"}, TypeError, ["live", "True, False or None"]),
        ({"max_restarts": -1}, ValueError, ["max_restarts", "integer >= 0"]),
        ({"threads_per_process": 0}, ValueError, ["threads_per_process"]),
        ({"num_nodes": 2, "node_rank": 2}, ValueError, ["node_rank", "= 1"]),
        ({"mixed_precision": None}, TypeError, ["mixed_precision"]),
    ],
)
def test_bad_values_name_the_field_and_allowed_values(
    changes: dict, error: type[Exception], words: list[str]
) -> None:
    with pytest.raises(error) as raised:
        LaunchConfig(**changes)
    for word in words:
        assert word in str(raised.value)


def test_values_are_normalised_and_config_is_immutable() -> None:
    config = LaunchConfig(backend="auto", num_processes=np.int64(2))
    assert config.backend is None
    assert type(config.num_processes) is int
    with pytest.raises(AttributeError):
        config.num_processes = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="num_processes"):
        config.replace(num_processes=0)


def test_positional_arguments_are_refused() -> None:
    with pytest.raises(TypeError):
        LaunchConfig(2)  # type: ignore[misc]


def test_field_errors_collects_every_problem() -> None:
    errors = field_errors({"num_processes": 0, "mixed_precision": "fp8", "seed": 1})
    assert set(errors) == {"num_processes", "mixed_precision"}
    assert field_errors(LaunchConfig().to_dict()) == {}


@pytest.mark.parametrize(
    ("field", "text", "value"),
    [
        ("num_processes", "auto", None),
        ("num_processes", " 3 ", 3),
        ("seed", "", None),
        ("seed", "none", None),
        ("backend", "auto", None),
        ("backend", "gloo", "gloo"),
        ("live", "No", False),
        ("live", "y", True),
        ("live", "auto", None),
        ("master_addr", "10.0.0.1", "10.0.0.1"),
    ],
)
def test_parse_field_reads_typed_answers(field: str, text: str, value: object) -> None:
    assert parse_field(field, text) == value


@pytest.mark.parametrize(
    ("field", "text"),
    [("num_processes", "two"), ("num_nodes", "auto"), ("live", "maybe"), ("master_port", "0")],
)
def test_parse_field_rejects_bad_answers(field: str, text: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_field(field, text)


def test_file_round_trip_is_readable_json(tmp_path: Path) -> None:
    config = EVERY_FIELD_SET
    path = config.save(tmp_path / "nested" / "run.json")
    assert LaunchConfig.load(path) == config
    data = json.loads(path.read_text())
    assert data["mixed_precision"] == "bf16"
    assert list(data) == list(LaunchConfig().to_dict())
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]  # no temporary left


def test_missing_keys_take_builtin_defaults(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text('{"num_processes": 2, "backend": null}')
    assert LaunchConfig.load(path) == LaunchConfig(num_processes=2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"num_proceses": 2}', "did you mean 'num_processes'"),
        ('{"__class__": "os.system"}', "Unknown LaunchConfig key"),
        ('{"seed": 1, "seed": 2}', "appears twice"),
        ("[1, 2]", "JSON object"),
        ("num_processes = 2", "not valid JSON"),
        ('{"mixed_precision": "fp8"}', "mixed_precision must be one of"),
    ],
)
def test_bad_files_are_rejected_with_the_path(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as raised:
        LaunchConfig.load(path)
    assert str(path) in str(raised.value)


def test_wrong_type_in_file_is_a_type_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"num_processes": "two"}')
    with pytest.raises(TypeError, match="num_processes") as raised:
        LaunchConfig.load(path)
    assert str(path) in str(raised.value)


def test_default_path_follows_env_var_then_xdg(
    config_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert default_config_path() == config_file
    monkeypatch.delenv("NOTEBOOK_KIT_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert default_config_path() == tmp_path / "xdg" / "notebook_kit" / "launch.json"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_config_path() == tmp_path / "home" / ".config" / "notebook_kit" / "launch.json"


def test_save_and_load_without_path_use_the_default_file(config_file: Path) -> None:
    assert saved_default() is None
    assert LaunchConfig(seed=5).save() == config_file
    assert LaunchConfig.load() == LaunchConfig(seed=5) == saved_default()


def test_broken_saved_default_raises_instead_of_being_ignored(config_file: Path) -> None:
    config_file.parent.mkdir(parents=True)
    config_file.write_text('{"num_processes": -1}')
    with pytest.raises(ValueError, match="notebook-kit config"):
        resolve_launch_config()


def test_precedence_explicit_over_config_over_saved_over_builtin() -> None:
    assert resolve_launch_config() == LaunchConfig()

    LaunchConfig(num_processes=3, mixed_precision="fp16", seed=9).save()
    resolved = resolve_launch_config()
    assert (resolved.num_processes, resolved.mixed_precision, resolved.seed) == (3, "fp16", 9)

    given = LaunchConfig(num_processes=2)
    assert resolve_launch_config(given) == given  # a config replaces the saved file as a whole

    resolved = resolve_launch_config(given, num_processes=4, mixed_precision="bf16")
    assert (resolved.num_processes, resolved.mixed_precision, resolved.seed) == (4, "bf16", None)

    resolved = resolve_launch_config(None, backend="gloo")
    assert (resolved.num_processes, resolved.backend) == (3, "gloo")


def test_an_argument_wins_over_the_same_setting_s_variable() -> None:
    resolved = resolve_launch_config(None, {"NOTEBOOK_KIT_NUM_PROCESSES": "3"}, num_processes=2)
    assert resolved.num_processes == 2


def test_explicit_none_means_not_given() -> None:
    given = LaunchConfig(num_processes=2, seed=1)
    assert resolve_launch_config(given, num_processes=None, seed=None) == given


def test_explicit_values_are_validated_and_unknown_names_refused() -> None:
    with pytest.raises(ValueError, match="mixed_precision"):
        resolve_launch_config(mixed_precision="fp64")
    with pytest.raises(TypeError, match="did you mean 'num_processes'"):
        resolve_launch_config(num_process=2)
