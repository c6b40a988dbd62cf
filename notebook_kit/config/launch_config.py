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
import json
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from notebook_kit.atomic_file import replace_atomically
from notebook_kit.config.arguments import (
    BACKEND_CHOICES,
    MIXED_PRECISION_CHOICES,
    Backend,
    MixedPrecision,
    loopback_master_problem,
)

__all__ = [
    "CONFIG_ENV_VAR",
    "FIELD_HELP",
    "LaunchConfig",
    "choice_words",
    "default_config_path",
    "field_errors",
    "parse_field",
    "read_saved_default",
    "resolve_launch_config",
    "saved_default",
]

CONFIG_ENV_VAR = "NOTEBOOK_KIT_CONFIG"

_AUTO_WORDS = ("auto", "none", "")


@dataclass(frozen=True)
class _Spec:
    """What one field accepts; drives validation, parsing and the error messages."""

    kind: Literal["int", "str", "bool", "choice"]
    optional: bool = False
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()


_SPECS: dict[str, _Spec] = {
    "num_processes": _Spec("int", optional=True, minimum=1),
    "mixed_precision": _Spec("choice", choices=MIXED_PRECISION_CHOICES),
    "gradient_accumulation_steps": _Spec("int", minimum=1),
    "backend": _Spec("choice", optional=True, choices=BACKEND_CHOICES),
    # numpy and random accept seeds in [0, 2**32); torch accepts more, so the narrower range wins.
    "seed": _Spec("int", optional=True, minimum=0, maximum=2**32 - 1),
    "master_addr": _Spec("str"),
    "master_port": _Spec("int", optional=True, minimum=1, maximum=65535),
    "num_nodes": _Spec("int", minimum=1),
    "node_rank": _Spec("int", minimum=0),
    "threads_per_process": _Spec("int", optional=True, minimum=1),
    "live": _Spec("bool", optional=True),
    "max_restarts": _Spec("int", minimum=0),
}

FIELD_HELP: dict[str, str] = {
    "num_processes": "Worker processes on this node; auto = one per GPU, else 1.",
    "mixed_precision": "Autocast dtype for the forward pass: no, fp16 or bf16.",
    "gradient_accumulation_steps": "Batches whose gradients add up before each optimizer step.",
    "backend": "torch.distributed backend; auto = nccl with GPUs, gloo on CPU.",
    "seed": "Seed for torch, numpy and random in every worker; empty = do not seed.",
    "master_addr": "Address of node 0, reachable from every node.",
    "master_port": "TCP port on node 0; empty = a free port on one node, 29500 across nodes.",
    "num_nodes": "Machines taking part; run the same launch on each of them.",
    "node_rank": "Index of this machine, 0 to num_nodes - 1; node 0 hosts master_addr.",
    "threads_per_process": "CPU threads per worker; auto = cores divided by workers.",
    "live": "Live plots, progress and a Stop button; auto = when a notebook shows them.",
    "max_restarts": "Times a failed launch is restarted before the error is raised.",
}


def _words(spec: _Spec) -> tuple[str, ...]:
    """The words a choice or yes/no field is answered with, ``"auto"`` first when optional."""
    if spec.kind == "choice":
        return ("auto", *spec.choices) if spec.optional else spec.choices
    if spec.kind == "bool":
        return ("auto", "yes", "no") if spec.optional else ("yes", "no")
    return ()


def choice_words(field: str) -> tuple[str, ...]:
    """The words field ``field`` is chosen from; empty for a number or an address.

    Example:
        >>> choice_words("backend"), choice_words("seed")
        (('auto', 'gloo', 'nccl'), ())
    """
    return _words(_SPECS[field])


def _allowed(spec: _Spec) -> str:
    """Describe the values a field accepts, for error messages and prompts."""
    if spec.kind == "choice":
        text = "one of " + ", ".join(repr(choice) for choice in _words(spec))
        return text + " (None means 'auto')" if spec.optional else text
    if spec.kind == "bool":
        return "True, False or None (auto)" if spec.optional else "True or False"
    if spec.kind == "str":
        return "a non-empty host name or IP address"
    if spec.maximum is not None:
        text = f"an integer from {spec.minimum} to {spec.maximum}"
    else:
        text = f"an integer >= {spec.minimum}"
    return text + " or None (auto)" if spec.optional else text


def _check(name: str, value: Any) -> Any:
    """Return ``value`` normalised for field ``name``, or raise TypeError/ValueError."""
    spec = _SPECS[name]
    problem = f"{name} must be {_allowed(spec)}; got {value!r}"
    if value is None or (spec.optional and spec.kind == "choice" and value == "auto"):
        if spec.optional:
            return None
        raise TypeError(problem + ".")
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise TypeError(f"{problem} ({type(value).__name__}).")
        return value
    if spec.kind in ("str", "choice"):
        if not isinstance(value, str):
            raise TypeError(f"{problem} ({type(value).__name__}).")
        if spec.kind == "choice" and value not in spec.choices:
            raise ValueError(problem + ".")
        if spec.kind == "str" and (not value or value != value.strip() or " " in value):
            raise ValueError(problem + ".")
        return value
    # bool is an int subclass, but True workers or a False port is always a mistake.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{problem} ({type(value).__name__}).")
    value = int(value)
    if (spec.minimum is not None and value < spec.minimum) or (
        spec.maximum is not None and value > spec.maximum
    ):
        raise ValueError(problem + ".")
    return value


def _check_fields(
    values: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, TypeError | ValueError]]:
    """The valid values normalised, and every problem keyed by field (also between fields)."""
    problems: dict[str, TypeError | ValueError] = {}
    checked: dict[str, Any] = {}
    for name, value in values.items():
        try:
            checked[name] = _check(name, value)
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


def parse_field(name: str, text: str) -> Any:
    """Turn what a person typed into a value for field ``name`` (validated).

    ``auto``, ``none`` or an empty answer mean None for optional fields.

    Example:
        >>> parse_field("master_port", "29500"), parse_field("seed", "")
        (29500, None)
    """
    spec = _SPECS[name]
    text = text.strip()
    if spec.optional and text.lower() in _AUTO_WORDS:
        return None
    value: Any = text
    if spec.kind == "int":
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{name} must be {_allowed(spec)}; got {text!r}.") from None
    elif spec.kind == "bool":
        answers = {"y": True, "yes": True, "true": True, "n": False, "no": False, "false": False}
        if text.lower() not in answers:
            raise ValueError(f"{name} must be auto, yes or no; got {text!r}.")
        value = answers[text.lower()]
    return _check(name, value)


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How to launch a training function; validated on creation, immutable afterwards.

    None means "decide at launch time" for ``num_processes`` (one per GPU, else 1), ``backend``
    (nccl with GPUs, else gloo; ``"auto"`` is accepted and stored as None), ``seed`` (no
    seeding), ``master_port`` (a free port on one node, 29500 across nodes),
    ``threads_per_process`` (cores / workers) and ``live`` (on when a notebook can show it).
    See ``FIELD_HELP`` for a one-line description of every field.

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

    def __post_init__(self) -> None:
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        checked, problems = _check_fields(values)
        if problems:
            raise next(iter(problems.values()))
        for name, value in checked.items():
            # Frozen: normalised values ("auto" -> None, numpy ints -> int) go in directly.
            object.__setattr__(self, name, value)

    def replace(self, **changes: Any) -> LaunchConfig:
        """A copy with ``changes`` applied and validated.

        Example:
            >>> LaunchConfig().replace(num_processes=4).num_processes
            4
        """
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field as a plain JSON-ready dict, in declaration order.

        Example:
            >>> LaunchConfig().to_dict()["mixed_precision"]
            'no'
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchConfig:
        """Build a config from a mapping; missing keys take built-in defaults.

        Raises:
            ValueError: A key is not a LaunchConfig field (the message suggests the closest).

        Example:
            >>> LaunchConfig.from_dict({"num_processes": 2}).num_processes
            2
        """
        unknown = [key for key in data if key not in _SPECS]
        if unknown:
            raise ValueError(_unknown_keys_message(unknown))
        return cls(**data)

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
        text = source.read_text(encoding="utf-8")
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


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON object hook: a key written twice is an editing mistake, not 'last one wins'."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"key {key!r} appears twice.")
        data[key] = value
    return data


def _unknown_keys_message(unknown: list[str]) -> str:
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), _SPECS, n=1)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"Unknown LaunchConfig key(s): {', '.join(parts)}. Known keys: {', '.join(_SPECS)}."


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


def resolve_launch_config(config: LaunchConfig | None = None, **explicit: Any) -> LaunchConfig:
    """The config a launch runs with: explicit arguments > ``config`` > saved default > built-in.

    A given ``config`` is complete, so it replaces the saved default as a whole. Explicit keyword
    arguments whose value is None count as not given.

    Raises:
        TypeError: An explicit argument is not a LaunchConfig field, or has the wrong type.
        ValueError: A value is out of range, or several nodes would meet at a loopback
            ``master_addr`` that was not given explicitly.

    Example:
        >>> resolve_launch_config(LaunchConfig(num_processes=2), num_processes=4).num_processes
        4
    """
    unknown = [name for name in explicit if name not in _SPECS]
    if unknown:
        raise TypeError(_unknown_keys_message(unknown))
    saved = saved_default() if config is None else None
    base = config if config is not None else saved or LaunchConfig()
    given = {name: value for name, value in explicit.items() if value is not None}
    resolved = base.replace(**given) if given else base
    if "master_addr" not in given:  # an address given explicitly is the caller's choice
        origin = "from config=" if config else f"from {default_config_path()}" if saved else ""
        problem = loopback_master_problem(
            resolved.num_nodes, resolved.master_addr, origin or "the default"
        )
        if problem:
            raise ValueError(problem)
    return resolved
