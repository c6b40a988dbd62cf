"""``notebook-kit config`` and ``notebook-kit env``: in-process for speed, then as real commands."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from notebook_kit import LaunchConfig
from notebook_kit.cli.main import (
    add_launch_config_arguments,
    build_parser,
    config_from_arguments,
    main,
)
from notebook_kit.config.command_line import launch_command_line

# Answers in question order for one node: num_nodes, num_processes, mixed_precision,
# gradient_accumulation_steps, backend, seed, threads_per_process, live, max_restarts, use_fsdp,
# the four parallelism_config_* sizes, storage_timeout, memory_history and start_method (KEEP:
# Enter keeps each).
KEEP = ["", "", "", "", "", "", ""]
SINGLE_NODE = ["1", "2", "bf16", "4", "gloo", "42", "", "no", "1", "", *KEEP]


pytestmark = pytest.mark.usefixtures("config_file")


def _run(monkeypatch: pytest.MonkeyPatch, answers: list[str], *argv: str) -> int:
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{a}\n" for a in answers)))
    return main(["config", *argv])


def test_questionnaire_writes_the_answers(
    monkeypatch: pytest.MonkeyPatch, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(monkeypatch, SINGLE_NODE) == 0
    assert LaunchConfig.load(config_file) == LaunchConfig(
        num_processes=2,
        mixed_precision="bf16",
        gradient_accumulation_steps=4,
        backend="gloo",
        seed=42,
        live=False,
        max_restarts=1,
    )
    assert f"Wrote {config_file}" in capsys.readouterr().out


def test_bad_answers_are_asked_again(
    monkeypatch: pytest.MonkeyPatch, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = ["0", "1", "two", "2", "fp32", "fp16", "", "", "-3", "", "", "perhaps", "", "", ""]
    answers += KEEP
    assert _run(monkeypatch, answers) == 0
    out = capsys.readouterr().out
    assert "num_nodes must be an integer >= 1; got 0. Please try again." in out
    assert "got 'two'" in out
    assert "mixed_precision must be one of 'no', 'fp16', 'bf16'; got 'fp32'" in out
    assert "seed must be an integer from 0 to 4294967295" in out
    assert "live must be auto, yes or no" in out
    assert LaunchConfig.load(config_file) == LaunchConfig(num_processes=2, mixed_precision="fp16")


def test_multi_node_questions_check_answers_against_each_other(
    monkeypatch: pytest.MonkeyPatch, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # num_nodes, node_rank (bad, then good), master_addr (Enter keeps the loopback default:
    # refused, then good), master_port, then the rest.
    answers = ["2", "2", "1", "", "10.0.0.1", "29500", "", "", "", "", "", "", "", "", "", *KEEP]
    assert _run(monkeypatch, answers) == 0
    out = capsys.readouterr().out
    assert "node_rank must be from 0 to num_nodes - 1 = 1; got 2" in out
    assert "master_addr is '127.0.0.1' (as the saved default), which only this machine" in out
    saved = LaunchConfig.load(config_file)
    assert (saved.num_nodes, saved.node_rank, saved.master_addr, saved.master_port) == (
        2,
        1,
        "10.0.0.1",
        29500,
    )


def test_enter_keeps_the_current_saved_values(
    monkeypatch: pytest.MonkeyPatch, config_file: Path
) -> None:
    existing = LaunchConfig(num_processes=2, seed=5, mixed_precision="fp16")
    existing.save()
    assert _run(monkeypatch, [""] * 17) == 0  # one Enter per question
    assert LaunchConfig.load(config_file) == existing


def test_end_of_input_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(monkeypatch, ["1", "2"]) == 1
    assert "nothing was written" in capsys.readouterr().err
    assert not config_file.exists()


def test_default_flag_writes_builtin_defaults_without_questions(
    monkeypatch: pytest.MonkeyPatch, config_file: Path, tmp_path: Path
) -> None:
    LaunchConfig(seed=1).save()
    assert _run(monkeypatch, [], "--default") == 0
    assert LaunchConfig.load(config_file) == LaunchConfig()
    elsewhere = tmp_path / "other.json"
    assert _run(monkeypatch, [], "--default", "--path", str(elsewhere)) == 0
    assert LaunchConfig.load(elsewhere) == LaunchConfig()


def test_unreadable_existing_file_is_replaced_not_crashed(
    monkeypatch: pytest.MonkeyPatch, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file.parent.mkdir(parents=True)
    config_file.write_text("{not json")
    assert _run(monkeypatch, [""] * 17) == 0  # one Enter per question
    assert "Ignoring the unreadable config file" in capsys.readouterr().out
    assert LaunchConfig.load(config_file) == LaunchConfig()


def test_env_prints_text_and_json(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "Fork-safe" in out and str(config_file) in out
    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config_path"] == str(config_file)
    assert report["fork_safe"] is True


def test_no_subcommand_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "config" in capsys.readouterr().out


def test_subcommands_are_registered_one_function_each() -> None:
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) >= {"config", "env"}


def test_launch_options_round_trip_through_the_rendered_command() -> None:
    parser = argparse.ArgumentParser()
    add_launch_config_arguments(parser)
    config = LaunchConfig(num_processes=3, backend="gloo", master_port=29501, live=False)
    words = launch_command_line(config).split()[2:-1]
    assert config_from_arguments(parser.parse_args(words)) == config
    assert vars(parser.parse_args([])) == {}
    with pytest.raises(SystemExit):
        parser.parse_args(["--mixed-precision", "fp8"])


def _command_env(config_file: Path) -> dict[str, str]:
    env = dict(os.environ, NOTEBOOK_KIT_CONFIG=str(config_file))
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


@pytest.mark.integration
def test_module_questionnaire_through_stdin(config_file: Path) -> None:
    answers = "1\nthree\n2\nfp16\n" + "\n" * 14  # Enter keeps the rest
    result = subprocess.run(
        [sys.executable, "-m", "notebook_kit", "config"],
        input=answers,
        capture_output=True,
        text=True,
        env=_command_env(config_file),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "got 'three'. Please try again." in result.stdout
    assert LaunchConfig.load(config_file) == LaunchConfig(num_processes=2, mixed_precision="fp16")


@pytest.mark.integration
def test_console_script_default_and_env(config_file: Path) -> None:
    script = shutil.which("notebook-kit", path=str(Path(sys.executable).parent))
    assert script is not None, "the notebook-kit console script is not installed"
    env = _command_env(config_file)
    result = subprocess.run(
        [script, "config", "--default"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert LaunchConfig.load(config_file) == LaunchConfig()
    result = subprocess.run([script, "env"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "num_processes = auto" in result.stdout
