"""The settings schema: every place that names a launch setting agrees with it.

The public signatures are written out for ``help()`` and type checkers; these tests compare
them with the schema, so a setting added to one and not the other fails here. A made-up
setting, added to the schema alone, reaches the config file, the panel, the command line, the
environment variables and the environment report.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest

import notebook_kit
from notebook_kit import ConfigPanel, LaunchConfig, WorkerPool, notebook_launcher
from notebook_kit.cli.main import add_launch_config_arguments, config_from_arguments
from notebook_kit.config import schema
from notebook_kit.config.launch_config import resolve_launch_config
from notebook_kit.config.schema import CALL_SETTINGS, SETTINGS, Setting
from notebook_kit.launch.launcher import notebook_launcher_async

pytestmark = pytest.mark.usefixtures("config_file")


def _expected(overrides: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(keyword, annotation, default) of every setting as the launcher takes it.

    A stored setting's keyword defaults to None, "not given": the config, the saved default
    or the schema's default decides. A call setting defaults to the schema's default.
    """
    stored = [(s.keyword, s.annotation | None, None) for s in SETTINGS.values()]
    call = [(s.keyword, s.annotation, s.default) for s in CALL_SETTINGS.values()]
    return [(name, kind, overrides.get(name, default)) for name, kind, default in (*stored, *call)]


@pytest.mark.parametrize(
    ("function", "overrides"),
    [
        (notebook_launcher, {}),
        (notebook_launcher_async, {}),
        (WorkerPool.__init__, {"isolate": True}),  # a pool always forks
    ],
    ids=["notebook_launcher", "notebook_launcher_async", "WorkerPool"],
)
def test_launch_signatures_follow_the_schema(function: Any, overrides: dict[str, Any]) -> None:
    keywords = {setting.keyword for setting in (*SETTINGS.values(), *CALL_SETTINGS.values())}
    hints = typing.get_type_hints(function)
    found = [
        (name, hints[name], parameter.default)
        for name, parameter in inspect.signature(function).parameters.items()
        if name in keywords
    ]
    assert found == _expected(overrides)
    documented = inspect.getdoc(function if function is not WorkerPool.__init__ else WorkerPool)
    assert "num_processes" in (documented or "")


def test_launch_config_fields_follow_the_schema() -> None:
    hints = typing.get_type_hints(LaunchConfig)
    fields = [field for field in dataclasses.fields(LaunchConfig) if field.name != "_more"]
    found = [(field.name, hints[field.name], field.default) for field in fields]
    assert found == [(s.name, s.annotation, s.default) for s in SETTINGS.values()]
    assert LaunchConfig().to_dict() == {s.name: s.default for s in SETTINGS.values()}


def test_every_setting_is_complete() -> None:
    for setting in (*SETTINGS.values(), *CALL_SETTINGS.values()):
        assert setting.help.endswith(".") and len(setting.help) < 80, setting.name
        if setting.kind == "int":
            assert setting.minimum is not None, setting.name
        if setting.widget == "count":
            assert setting.upper is not None, f"{setting.name}: a bounded box needs a maximum"
        assert (setting.kind == "choice") == bool(setting.choices), setting.name


def test_the_launcher_and_the_config_refuse_the_same_range() -> None:
    """One range per setting: the value just outside it fails in both, inside it passes."""
    for name, setting in SETTINGS.items():
        if setting.kind != "int" or setting.upper is None:
            continue
        with pytest.raises(ValueError, match=setting.keyword):
            schema.check_argument(setting, setting.upper + 1)
        with pytest.raises(ValueError, match=name):
            LaunchConfig.from_dict({name: setting.upper + 1})
        assert schema.check_argument(setting, setting.upper) == setting.upper
    with pytest.raises(ValueError, match="seed must be >= 0 and <= 4294967295"):
        notebook_launcher(lambda: None, seed=2**32)


_MADE_UP = Setting(
    "prefetch_batches",
    "int",
    2,
    "Batches each worker loads ahead of the one it trains on.",
    int,
    minimum=0,
    ceiling=64,
    widget="count",
)


@pytest.fixture
def made_up(monkeypatch: pytest.MonkeyPatch) -> Setting:
    """The schema with one more setting, declared there and nowhere else."""
    monkeypatch.setitem(SETTINGS, _MADE_UP.name, _MADE_UP)
    return _MADE_UP


def test_a_setting_added_to_the_schema_reaches_the_config(made_up: Setting, tmp_path: Path) -> None:
    config = LaunchConfig(num_processes=2)
    assert config.prefetch_batches == 2 and config.to_dict()["prefetch_batches"] == 2
    changed = config.replace(prefetch_batches=5)
    assert changed.prefetch_batches == 5 and changed != config
    assert LaunchConfig.load(changed.save(tmp_path / "run.json")) == changed
    with pytest.raises(ValueError, match="prefetch_batches must be an integer from 0 to 64"):
        config.replace(prefetch_batches=65)
    assert resolve_launch_config(None, prefetch_batches=7).prefetch_batches == 7


def test_a_setting_added_to_the_schema_reaches_the_panel(made_up: Setting) -> None:
    panel = ConfigPanel()
    widget = panel.widgets["prefetch_batches"]
    assert (widget.min, widget.max, widget.value) == (0, 64, 2)
    assert "Batches each worker loads ahead" in panel.notes["prefetch_batches"].value
    widget.value = 9
    assert panel.config.prefetch_batches == 9
    assert "--prefetch-batches 9" in panel.command_line()


def test_a_setting_added_to_the_schema_reaches_the_command_line(
    made_up: Setting, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_launch_config_arguments(parser)
    given = parser.parse_args(["--prefetch-batches", "4"])
    assert config_from_arguments(given, LaunchConfig()).prefetch_batches == 4
    with pytest.raises(SystemExit):
        parser.parse_args(["--prefetch-batches", "-1"])
    assert "prefetch_batches must be an integer >= 0; got -1" in capsys.readouterr().err
    parser.print_help()
    assert "--prefetch-batches PREFETCH_BATCHES" in capsys.readouterr().out


def test_a_setting_added_to_the_schema_reaches_the_environment(
    made_up: Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTEBOOK_KIT_PREFETCH_BATCHES", "6")
    assert resolve_launch_config().prefetch_batches == 6
    assert resolve_launch_config(LaunchConfig()).prefetch_batches == 2  # config= is complete
    report = notebook_kit.environment()
    assert report.environment_settings == {"prefetch_batches": 6}
    assert "NOTEBOOK_KIT_PREFETCH_BATCHES=6" in report.to_text()
    LaunchConfig().replace(prefetch_batches=3).save()
    assert "prefetch_batches = 3" in notebook_kit.environment().to_text()
    monkeypatch.setenv("NOTEBOOK_KIT_PREFETCH_BATCHES", "many")
    with pytest.raises(ValueError, match=r"\$NOTEBOOK_KIT_PREFETCH_BATCHES='many'"):
        resolve_launch_config()
    assert "NOTEBOOK_KIT_PREFETCH_BATCHES" in (notebook_kit.environment().environment_error or "")


def test_every_engine_of_the_table_is_lazy_and_has_both_sides() -> None:
    """The engine table, walked as the schema is: the table imports no engine, and each row's
    kernel side implements ``Engine`` and its node-side link ``NodeLink``."""
    import importlib
    import subprocess
    import sys

    from notebook_kit.launch.cluster.engine import Engine
    from notebook_kit.launch.cluster.engines import ENGINES
    from notebook_kit.node.task import NodeLink

    check = (
        "import sys; from notebook_kit.launch.cluster.engines import ENGINES; "
        "[row.takes(value) for row in ENGINES for value in ('ray', object())]; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'dask', 'distributed', 'ray'}))"
    )
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr

    def members(protocol: type) -> set[str]:
        declared = {*vars(protocol), *vars(protocol).get("__annotations__", {})}
        return {name for name in declared if not name.startswith("_")}

    for row in ENGINES:
        sides = {}
        for kind, where in (("engine", row.engine), ("link", row.link)):
            module, _, name = where.partition(":")
            sides[kind] = getattr(importlib.import_module(module), name)
        engine = inspect.signature(sides["engine"]).return_annotation
        engine_class = getattr(importlib.import_module(sides["engine"].__module__), engine)
        missing = members(Engine) - set(dir(engine_class))
        assert not missing, f"{row.engine} lacks Engine's {sorted(missing)}"
        missing = members(NodeLink) - {"worker"} - set(dir(sides["link"]))
        assert not missing, f"{row.link} lacks NodeLink's {sorted(missing)}"
        assert row.forms, row.engine
