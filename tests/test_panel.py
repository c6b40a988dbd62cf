"""ConfigPanel without a kernel: widget values are the config, problems show beside the field."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

import pytest

from notebook_kit import ConfigPanel, LaunchConfig
from notebook_kit.cli.main import add_launch_config_arguments, config_from_arguments
from notebook_kit.launch import launcher
from tests.configs import EVERY_FIELD_SET

pytestmark = pytest.mark.usefixtures("config_file")


def test_starts_from_builtin_defaults_without_a_saved_file() -> None:
    panel = ConfigPanel()
    assert panel.config == LaunchConfig()
    assert panel.errors == {}
    assert set(panel.widgets) == set(LaunchConfig().to_dict())


def test_starts_from_the_saved_default(config_file: Path) -> None:
    LaunchConfig(seed=3, mixed_precision="fp16").save()
    assert ConfigPanel().config == LaunchConfig(seed=3, mixed_precision="fp16")


def test_config_to_widgets_and_back() -> None:
    panel = ConfigPanel(EVERY_FIELD_SET)
    assert panel.widgets["seed"].value == "7"
    assert panel.widgets["backend"].value == "gloo"
    assert panel.config == EVERY_FIELD_SET
    panel.config = LaunchConfig()
    assert panel.widgets["seed"].value == ""
    assert panel.config == LaunchConfig()


def test_setting_widgets_from_code_changes_the_config() -> None:
    panel = ConfigPanel()
    panel.widgets["num_processes"].value = 2
    panel.widgets["mixed_precision"].value = "bf16"
    panel.widgets["seed"].value = "11"
    panel.widgets["live"].value = False
    assert panel.config == LaunchConfig(
        num_processes=2, mixed_precision="bf16", seed=11, live=False
    )
    assert 'mixed_precision="bf16"' in panel.code.value.replace("&quot;", '"')


def test_invalid_value_shows_beside_the_field_and_config_raises() -> None:
    panel = ConfigPanel()
    panel.widgets["master_port"].value = "99999"
    note = panel.notes["master_port"]
    assert "master_port must be an integer from 1 to 65535" in note.value
    assert "nk-error" in note._dom_classes
    assert "nk-error" not in panel.notes["seed"]._dom_classes
    assert "Fix master_port (see the red message beside it)" in panel.code.value
    with pytest.raises(ValueError, match="master_port"):
        _ = panel.config
    panel.widgets["master_port"].value = ""
    assert "nk-error" not in note._dom_classes
    assert panel.config.master_port is None


def test_labels_fit_and_the_footer_names_what_to_fix() -> None:
    panel = ConfigPanel()
    longest = max(len(field) for field in panel.widgets)  # gradient_accumulation_steps
    for widget in panel.widgets.values():
        width = widget.style.description_width
        assert width.endswith("ch") and float(width[:-2]) > longest, width
    panel.widgets["seed"].value = "-5"
    panel.widgets["master_port"].value = "0"
    assert "marked in red" not in panel.code.value
    assert "Fix seed and master_port (see the red messages beside them)" in panel.code.value


def test_problem_between_fields_is_shown_on_the_later_field() -> None:
    panel = ConfigPanel()
    panel.widgets["num_nodes"].value = 2
    assert panel.errors == {}
    panel.widgets["node_rank"].value = 2
    assert set(panel.errors) == {"node_rank"}
    assert "num_nodes - 1 = 1" in panel.notes["node_rank"].value
    with pytest.raises(ValueError, match="node_rank"):
        _ = panel.config


def test_non_numeric_text_is_reported_not_crashed() -> None:
    panel = ConfigPanel()
    panel.widgets["seed"].value = "abc"
    panel.widgets["threads_per_process"].value = "many"
    assert set(panel.errors) == {"seed", "threads_per_process"}


def test_num_processes_is_bounded_by_the_machine_but_shows_bigger_configs() -> None:
    panel = ConfigPanel()
    values = [value for _, value in panel.widgets["num_processes"].options]
    assert values == ["auto", *range(1, panel.process_limit + 1)]
    panel.config = LaunchConfig(num_processes=panel.process_limit + 6)
    assert panel.config.num_processes == panel.process_limit + 6


def test_save_and_load_buttons(config_file: Path) -> None:
    panel = ConfigPanel()
    panel.load_button.click()
    assert "No saved default" in panel.status.value
    panel.config = EVERY_FIELD_SET
    panel.save_button.click()
    assert str(config_file) in panel.status.value
    assert LaunchConfig.load(config_file) == EVERY_FIELD_SET

    other = ConfigPanel(LaunchConfig())
    other.load_button.click()
    assert other.config == EVERY_FIELD_SET


def test_save_refuses_an_invalid_form(config_file: Path) -> None:
    panel = ConfigPanel()
    panel.widgets["seed"].value = "-5"
    panel.save_button.click()
    assert "Not saved" in panel.status.value
    assert not config_file.exists()


def test_broken_saved_default_is_reported_in_the_panel(config_file: Path) -> None:
    config_file.parent.mkdir(parents=True)
    config_file.write_text('{"colour": "red"}')
    panel = ConfigPanel()
    assert panel.config == LaunchConfig()
    assert "Unknown LaunchConfig key" in panel.status.value


def test_python_call_rebuilds_the_same_config() -> None:
    panel = ConfigPanel(EVERY_FIELD_SET)
    code = panel.python_call()
    assert code.startswith("from notebook_kit import LaunchConfig, notebook_launcher")
    namespace: dict[str, Any] = {}
    exec(code.split("\nnotebook_launcher(")[0], namespace)
    assert namespace["config"] == EVERY_FIELD_SET
    assert "config = LaunchConfig()" in ConfigPanel().python_call()


def _parse_command(command: str) -> LaunchConfig:
    parser = argparse.ArgumentParser()
    add_launch_config_arguments(parser)
    parser.add_argument("script")
    words = shlex.split(command)
    assert words[:2] == ["notebook-kit", "launch"]
    return config_from_arguments(parser.parse_args(words[2:]))


def test_command_line_means_the_same_with_or_without_a_saved_default() -> None:
    panel = ConfigPanel(EVERY_FIELD_SET)
    command = panel.command_line()
    assert command.startswith("notebook-kit launch --num-processes 2 --mixed-precision bf16")
    assert command.endswith(" --live no --max-restarts 1 train.py")
    assert _parse_command(command) == EVERY_FIELD_SET

    LaunchConfig(seed=99, num_processes=1).save()  # a later saved default must not leak in
    panel = ConfigPanel(LaunchConfig(num_processes=2))
    command = panel.command_line()
    assert "--seed auto" in command
    assert _parse_command(command) == LaunchConfig(num_processes=2)


def test_launch_passes_the_panel_config(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def fake_launcher(function: Any, args: tuple = (), **kwargs: Any) -> str:
        calls.append((function, args, kwargs))
        return "done"

    monkeypatch.setattr(launcher, "notebook_launcher", fake_launcher)
    panel = ConfigPanel(LaunchConfig(num_processes=2))
    assert panel.launch(print, args=(1,), timeout=5.0) == "done"
    assert calls == [(print, (1,), {"config": LaunchConfig(num_processes=2), "timeout": 5.0})]

    panel.widgets["seed"].value = "x"
    with pytest.raises(ValueError, match="seed"):
        panel.launch(print)
    assert len(calls) == 1


def test_auto_choices_are_real_selections_and_fields_have_classes() -> None:
    panel = ConfigPanel(LaunchConfig())
    for field in ("num_processes", "backend", "live"):
        dropdown = panel.widgets[field]
        assert dropdown.index == 0 and dropdown.label == "auto"  # shown as chosen, not blank
        assert f"nk-field-{field}" in dropdown._dom_classes
    assert panel.config.num_processes is None and panel.config.backend is None
    panel.widgets["num_processes"].value = 2
    panel.widgets["num_processes"].value = "auto"
    assert panel.config.num_processes is None


def test_a_saved_panel_reads_without_widget_state() -> None:
    panel = ConfigPanel(LaunchConfig(num_processes=2, mixed_precision="bf16"))
    bundle = panel._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle, "live, it is still the form"
    for kind in ("text/plain", "text/html"):
        assert "LaunchConfig(num_processes=2, mixed_precision=" in bundle[kind]
        assert "notebook-kit launch --num-processes 2 --mixed-precision bf16" in bundle[kind]
    panel.widgets["seed"].value = "x"
    assert "invalid values" in panel._repr_mimebundle_()["text/plain"]
