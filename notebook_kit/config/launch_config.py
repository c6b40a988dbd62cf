"""Launch settings as plain data: :class:`LaunchConfig`, its file format and the saved default.

One ``LaunchConfig`` is shared by the panel, the command line and the launcher. It is validated
when it is created, so a bad value fails in the cell that wrote it, not inside a worker.

Files are JSON: the standard library reads and writes it on every supported Python, ``null``
spells "auto" without a special word, and the parser never runs code. Unknown keys are rejected
so a typo cannot be silently ignored.

The saved default lives in ``$NOTEBOOK_KIT_CONFIG`` when that is set, otherwise in
``$XDG_CONFIG_HOME/notebook_kit/launch.json`` (``~/.config/notebook_kit/launch.json``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from notebook_kit.atomic_file import replace_atomically
from notebook_kit.config.arguments import (
    Backend,
    MixedPrecision,
    StartMethod,
    loopback_master_problem,
)
from notebook_kit.config.schema import SETTINGS, check_value, settings_from_environ

__all__ = [
    "CONFIG_ENV_VAR",
    "LaunchConfig",
    "default_config_path",
    "field_errors",
    "read_saved_default",
    "resolve_launch_config",
    "saved_default",
]

CONFIG_ENV_VAR = "NOTEBOOK_KIT_CONFIG"


def _check_fields(
    values: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, TypeError | ValueError]]:
    """The valid values normalised, and every problem keyed by field (also between fields)."""
    problems: dict[str, TypeError | ValueError] = {}
    checked: dict[str, Any] = {}
    for name, value in values.items():
        try:
            checked[name] = check_value(name, value)
        except (TypeError, ValueError) as error:
            problems[name] = error
    if {"num_nodes", "node_rank"} <= checked.keys() and checked["node_rank"] >= checked[
        "num_nodes"
    ]:
        problems["node_rank"] = ValueError(
            f"node_rank must be from 0 to num_nodes - 1 = {checked['num_nodes'] - 1}; "
            f"got {checked['node_rank']}."
        )
    return checked, problems


def field_errors(values: Mapping[str, Any]) -> dict[str, str]:
    """Validate field values without building a config.

    Args:
        values: Field names mapped to candidate values (a subset is fine).

    Returns:
        Field name -> error message, empty when every value is valid.

    Example:
        >>> field_errors({"mixed_precision": "fp32"})
        {'mixed_precision': "mixed_precision must be one of 'no', 'fp16', 'bf16'; got 'fp32'."}
    """
    return {name: str(error) for name, error in _check_fields(values)[1].items()}


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How to launch a training function; validated on creation, immutable afterwards.

    None means "decide at launch time" for ``num_processes`` (one per GPU, else 1), ``backend``
    (nccl with GPUs, else gloo; ``"auto"`` is accepted and stored as None), ``seed`` (no
    seeding), ``master_port`` (a free port on one node, 29500 across nodes),
    ``threads_per_process`` (cores / workers) and ``live`` (on when a notebook can show it).
    The fields follow :data:`~notebook_kit.config.schema.SETTINGS`, where each one's type,
    range and help are declared. A setting declared there but not written out here yet is
    kept by name (read as an attribute, set through :meth:`replace` and :meth:`from_dict`), so
    it works everywhere before its field is written; the schema test asks for the field, which
    type checkers and ``help()`` need.

    Raises:
        TypeError: A value has the wrong type, e.g. ``num_processes="two"``.
        ValueError: A value is out of range; the message names the field and allowed values.

    Example:
        >>> config = LaunchConfig(num_processes=2, mixed_precision="bf16")
        >>> config.replace(seed=0).seed
        0
    """

    num_processes: int | None = None
    mixed_precision: MixedPrecision = "no"
    gradient_accumulation_steps: int = 1
    backend: Backend | None = None
    seed: int | None = None
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    num_nodes: int = 1
    node_rank: int = 0
    threads_per_process: int | None = None
    live: bool | None = None
    max_restarts: int = 0
    use_fsdp: bool = False
    parallelism_config_dp_replicate_size: int = 1
    parallelism_config_dp_shard_size: int = 1
    parallelism_config_tp_size: int = 1
    parallelism_config_cp_size: int = 1
    storage_timeout: int = 60
    memory_history: bool = False
    start_method: StartMethod = "auto"
    _more: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, hash=False)

    def __post_init__(self) -> None:
        written = _written_fields()
        unknown = [name for name in self._more if name not in SETTINGS or name in written]
        if unknown:
            raise TypeError(_unknown_keys_message(unknown))
        values = {
            name: getattr(self, name) if name in written else self._more.get(name, setting.default)
            for name, setting in SETTINGS.items()
        }
        checked, problems = _check_fields(values)
        if problems:
            raise next(iter(problems.values()))
        for name, value in checked.items():
            # Frozen: normalised values ("auto" -> None, numpy ints -> int) go in directly.
            if name in written:
                object.__setattr__(self, name, value)
        more = {name: value for name, value in checked.items() if name not in written}
        object.__setattr__(self, "_more", more)

    def __getattr__(self, name: str) -> Any:
        """A setting of the schema that has no field written out here (see the class doc)."""
        more = self.__dict__.get("_more", {})
        if name in more:
            return more[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def replace(self, **changes: Any) -> LaunchConfig:
        """A copy with ``changes`` applied and validated.

        Example:
            >>> LaunchConfig().replace(num_processes=4).num_processes
            4
        """
        unknown = [name for name in changes if name not in SETTINGS]
        if unknown:
            raise TypeError(_unknown_keys_message(unknown))
        fields, more = _split_by_field(changes)
        return dataclasses.replace(self, **fields, _more={**self._more, **more})

    def to_dict(self) -> dict[str, Any]:
        """Every setting as a plain JSON-ready dict, in the schema's order.

        Example:
            >>> LaunchConfig().to_dict()["mixed_precision"]
            'no'
        """
        return {name: getattr(self, name) for name in SETTINGS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchConfig:
        """Build a config from a mapping; missing keys take built-in defaults.

        Raises:
            ValueError: A key is not a LaunchConfig field (the message suggests the closest).

        Example:
            >>> LaunchConfig.from_dict({"num_processes": 2}).num_processes
            2
        """
        unknown = [key for key in data if key not in SETTINGS]
        if unknown:
            raise ValueError(_unknown_keys_message(unknown))
        fields, more = _split_by_field(data)
        return cls(**fields, _more=more)

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write this config as JSON (to the saved-default file when ``path`` is None).

        The file is replaced atomically, so a crash never leaves half a file behind.

        Returns:
            The path written.

        Example:
            >>> LaunchConfig(num_processes=2).save("/tmp/run.json")
            PosixPath('/tmp/run.json')
        """
        target = Path(path) if path is not None else default_config_path()
        target.parent.mkdir(parents=True, exist_ok=True)
        text = (json.dumps(self.to_dict(), indent=2) + "\n").encode("utf-8")
        replace_atomically(target, lambda file: file.write(text))
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> LaunchConfig:
        """Read a config written by :meth:`save` (the saved default when ``path`` is None).

        Raises:
            FileNotFoundError: There is no such file.
            ValueError: The file is not a JSON object, has unknown keys or a bad value.
            TypeError: A value in the file has the wrong type.

        Example:
            >>> path = LaunchConfig(num_processes=2).save("/tmp/run.json")
            >>> LaunchConfig.load(path).num_processes
            2
        """
        source = Path(path) if path is not None else default_config_path()
        try:
            text = source.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{source} is not UTF-8 text ({error.reason} at byte {error.start}), so it "
                "cannot be a config file: those are JSON, as `notebook-kit config` writes them."
            ) from error
        try:
            data = json.loads(text, object_pairs_hook=_reject_duplicates)
        except json.JSONDecodeError as error:
            raise ValueError(f"{source} is not valid JSON: {error}.") from error
        except ValueError as error:  # from _reject_duplicates
            raise ValueError(f"{source}: {error}") from error
        if not isinstance(data, dict):
            raise ValueError(f"{source} must hold a JSON object of LaunchConfig fields.")
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as error:
            raise type(error)(
                f"{source}: {error} Fix the file, or rewrite it with `notebook-kit config`."
            ) from error


# help() and inspect show the settings only: ``_more`` is how from_dict and replace pass
# settings that have no field written out yet, never an argument to write.
LaunchConfig.__signature__ = inspect.signature(LaunchConfig).replace(  # type: ignore[attr-defined]
    parameters=[p for p in inspect.signature(LaunchConfig).parameters.values() if p.name != "_more"]
)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON object hook: a key written twice is an editing mistake, not 'last one wins'."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"key {key!r} appears twice.")
        data[key] = value
    return data


@functools.cache
def _written_fields() -> frozenset[str]:
    """The settings written out as LaunchConfig fields (fixed once the class exists)."""
    return frozenset(field.name for field in dataclasses.fields(LaunchConfig)) - {"_more"}


def _split_by_field(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``values`` as (those written out as fields, the rest, kept in ``_more``)."""
    written = _written_fields()
    fields = {name: value for name, value in values.items() if name in written}
    return fields, {name: value for name, value in values.items() if name not in written}


def _unknown_keys_message(unknown: list[str]) -> str:
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), SETTINGS, n=1)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"Unknown LaunchConfig key(s): {', '.join(parts)}. Known keys: {', '.join(SETTINGS)}."


def default_config_path() -> Path:
    """Where the saved default lives: ``$NOTEBOOK_KIT_CONFIG``, else the user config directory.

    Example:
        >>> default_config_path().name
        'launch.json'
    """
    override = os.environ.get(CONFIG_ENV_VAR)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "notebook_kit" / "launch.json"


def saved_default() -> LaunchConfig | None:
    """The saved default config, or None when no default file exists.

    A file that exists but is broken raises, naming the file: silently ignoring it would
    launch with settings the user did not choose.

    Example:
        >>> config = saved_default() or LaunchConfig()
    """
    path = default_config_path()
    if path.is_dir():
        origin = (
            f"${CONFIG_ENV_VAR} names" if os.environ.get(CONFIG_ENV_VAR) else "The saved default,"
        )
        raise ValueError(
            f"{origin} {path}, which is a directory, not a config file. Point "
            f"${CONFIG_ENV_VAR} at a file (e.g. {path / 'launch.json'}) or unset it."
        )
    if not path.is_file():
        return None
    return LaunchConfig.load(path)


def read_saved_default() -> tuple[LaunchConfig | None, OSError | TypeError | ValueError | None]:
    """The saved default (None when there is none), or the reason it cannot be read.

    For callers that report a broken file rather than fail on it.

    Example:
        >>> config, problem = read_saved_default()
    """
    try:
        return saved_default(), None
    except (OSError, TypeError, ValueError) as problem:
        return None, problem


def resolve_launch_config(
    config: LaunchConfig | None = None,
    environ: Mapping[str, str] | None = None,
    **explicit: Any,
) -> LaunchConfig:
    """The config a launch runs with: explicit arguments > ``config`` > ``NOTEBOOK_KIT_<NAME>``
    variables > saved default > built-in.

    A given ``config`` is complete, so it replaces the variables and the saved default as a
    whole. Explicit keyword arguments whose value is None count as not given. ``environ``
    defaults to ``os.environ``.

    Raises:
        TypeError: An explicit argument is not a LaunchConfig field, or has the wrong type.
        ValueError: A value is out of range (a variable's error names the variable), or several
            nodes would meet at a loopback ``master_addr`` that was not given explicitly.

    Example:
        >>> resolve_launch_config(LaunchConfig(num_processes=2), num_processes=4).num_processes
        4
    """
    unknown = [name for name in explicit if name not in SETTINGS]
    if unknown:
        raise TypeError(_unknown_keys_message(unknown))
    from_environ = (
        {} if config else settings_from_environ(os.environ if environ is None else environ)
    )
    saved = saved_default() if config is None else None
    base = config if config is not None else saved or LaunchConfig()
    given = {name: value for name, value in explicit.items() if value is not None}
    resolved = base.replace(**{**from_environ, **given}) if from_environ or given else base
    if "master_addr" not in given:  # an address given explicitly is the caller's choice
        origin = "from config=" if config else f"from {default_config_path()}" if saved else ""
        if "master_addr" in from_environ:
            origin = f"from ${SETTINGS['master_addr'].env_var}"
        problem = loopback_master_problem(
            resolved.num_nodes, resolved.master_addr, origin or "the default"
        )
        if problem:
            raise ValueError(problem)
    return resolved
