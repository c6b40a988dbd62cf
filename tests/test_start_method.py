"""``start_method`` as a setting: where it comes from, what wins, and bad values refused first.

The keyword of a launch and of a pool, ``config=``, ``set_start_method()``, the variable, the
saved default, the panel and the command line all give it; a bad value from any of them is
refused before anything is forked, naming ``start_method`` and its values. "fork" on a process
that cannot fork safely is refused for a launch and a pool alike, before anything starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import psutil
import pytest
import torch.distributed as dist

from notebook_kit import (
    ConfigPanel,
    ForkSafetyError,
    LaunchConfig,
    WorkerPool,
    notebook_launcher,
    set_start_method,
)
from notebook_kit.cli.main import add_launch_config_arguments, config_from_arguments
from notebook_kit.launch import template_choice
from notebook_kit.launch.launcher import resolve_plan

pytestmark = pytest.mark.usefixtures("config_file")
VALUES = "start_method must be one of 'auto', 'fork', 'template'"


@pytest.fixture
def chosen() -> Iterator[None]:
    """set_start_method() may be called; the process's choice is undone afterwards."""
    try:
        yield
    finally:
        template_choice._chosen = None


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def test_bad_values_are_refused_before_anything_starts(monkeypatch):
    before = _children()
    with pytest.raises(ValueError, match=f"{VALUES} \\(or None\\), got 'spawn'"):
        notebook_launcher(print, num_processes=2, start_method="spawn")
    with pytest.raises(ValueError, match=f"{VALUES} \\(or None\\), got 'forkserver'"):
        WorkerPool(num_processes=2, start_method="forkserver")
    with pytest.raises(ValueError, match=VALUES):
        LaunchConfig(start_method="spawn")
    with pytest.raises(ValueError, match=f"set_start_method\\(\\): {VALUES}; got 'spawn'"):
        set_start_method("spawn")
    monkeypatch.setenv("NOTEBOOK_KIT_START_METHOD", "spawn")
    with pytest.raises(ValueError, match=f"NOTEBOOK_KIT_START_METHOD='spawn': {VALUES}"):
        notebook_launcher(print, num_processes=2)
    assert _children() <= before


def test_keyword_then_config_then_set_start_method_then_variable_then_saved(
    monkeypatch, chosen, config_file
):
    def method(**options) -> str:
        return resolve_plan({"num_processes": 2, **options}, "notebook_launcher").start_method

    assert method() == "auto"
    LaunchConfig(start_method="fork").save(config_file)
    assert method() == "fork"
    monkeypatch.setenv("NOTEBOOK_KIT_START_METHOD", "template")
    assert method() == "template" and template_choice.get_start_method() == "template"
    set_start_method("fork")
    assert method() == "fork" and template_choice.get_start_method() == "fork"
    assert method(config=LaunchConfig(start_method="template")) == "template"
    assert method(config=LaunchConfig(start_method="template"), start_method="auto") == "auto"
    pool = resolve_plan({"num_processes": 2, "start_method": "template"}, "WorkerPool")
    assert pool.start_method == "template"


def test_the_panel_and_the_command_line_give_it(capsys):
    panel = ConfigPanel()
    widget = panel.widgets["start_method"]
    assert [label for label, _ in widget.options] == ["auto", "fork", "template"]
    assert widget.value == "auto"
    widget.value = "template"
    assert panel.config.start_method == "template"
    assert "--start-method template" in panel.command_line()
    parser = argparse.ArgumentParser()
    add_launch_config_arguments(parser)
    given = parser.parse_args(["--start-method", "fork"])
    assert config_from_arguments(given, LaunchConfig()).start_method == "fork"
    with pytest.raises(SystemExit):
        parser.parse_args(["--start-method", "spawn"])
    assert "start_method must be one of" in capsys.readouterr().err


def test_fork_asked_of_a_process_that_cannot_fork_is_refused_for_a_launch_and_a_pool(tmp_path):
    before = _children()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        refusal = r"destroy_process_group.*start_method is 'fork'.*with 'auto' the workers"
        with pytest.raises(ForkSafetyError, match=refusal):
            notebook_launcher((tmp_path / "ran").touch, num_processes=2, start_method="fork")
        with pytest.raises(ForkSafetyError, match=refusal):
            WorkerPool(num_processes=2, start_method="fork")
    finally:
        dist.destroy_process_group()
    assert not (tmp_path / "ran").exists() and _children() <= before


@pytest.mark.parametrize("method", ["fork", "template"])
def test_a_script_launch_and_a_cluster_launch_refuse_it_naming_why(tmp_path, monkeypatch, method):
    from notebook_kit.cli.script_launch import LaunchInputError, plan_script_launch
    from notebook_kit.launch.cluster.cluster_plan import resolve_cluster_plan

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(LaunchInputError, match=r"^--start-method: torchrun starts a script's"):
        plan_script_launch(str(script), given={"start_method": method})
    monkeypatch.setenv("NOTEBOOK_KIT_START_METHOD", method)
    with pytest.raises(LaunchInputError, match=r"NOTEBOOK_KIT_START_METHOD\)\.$"):
        plan_script_launch(str(script), environ={"NOTEBOOK_KIT_START_METHOD": method})
    with pytest.raises(
        ValueError, match=r"start_method is chosen by the cluster .*forks its ranks"
    ):
        resolve_cluster_plan("tcp://127.0.0.1:1", {"start_method": method})
