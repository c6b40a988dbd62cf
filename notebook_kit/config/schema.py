"""The launch settings, each declared once: name, type, default, range, help and spellings.

Everything that names a launch setting is derived from :data:`SETTINGS`: the fields of
:class:`~notebook_kit.config.launch_config.LaunchConfig` and its JSON file, the checks of the
launcher's keyword arguments, the ``ConfigPanel`` widgets, the ``notebook-kit launch`` and
``notebook-kit config`` options, the ``NOTEBOOK_KIT_<NAME>`` environment variables and the
``notebook-kit env`` report. :data:`CALL_SETTINGS` are keywords of the launcher and the pool
only (they describe one call, so no file, panel or flag holds them).

To add a setting:

1. Add one :class:`Setting` to :data:`SETTINGS` (or :data:`CALL_SETTINGS`), with its ``scope``:
   where it goes on a cluster, whether a pool refuses it, whether workers read it.
2. Write it out where a signature must stay explicit for ``help()`` and type checkers, in
   schema order: a field of ``LaunchConfig``, and a keyword of the launchers' signature
   (``launch/launcher.py``, shared by ``notebook_launcher`` and its await form) and of
   ``WorkerPool``'s. ``tests/test_schema.py`` compares them with the schema (names, order,
   defaults, annotations) and says what is missing.
3. Use it: ``make_plan`` copies it into a ``LaunchPlan`` field of the same name, and a "worker"
   setting reaches every worker as its variable.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from notebook_kit.config import arguments
from notebook_kit.config.arguments import (
    BACKEND_CHOICES,
    MIXED_PRECISION_CHOICES,
    START_METHOD_CHOICES,
    Backend,
    MixedPrecision,
    StartMethod,
)

__all__ = [
    "CALL_SETTINGS",
    "ENV_PREFIX",
    "SETTINGS",
    "Setting",
    "allowed_values",
    "check_argument",
    "check_value",
    "choice_words",
    "parse_text",
    "scoped",
    "settings_from_environ",
]

ENV_PREFIX = "NOTEBOOK_KIT_"
_AUTO_WORDS = ("auto", "none", "")
_YES_NO = {"y": True, "yes": True, "true": True, "n": False, "no": False, "false": False}

Kind = Literal["int", "str", "bool", "choice", "seconds"]
# Where a setting goes. On a cluster (``cluster=``) exactly one of: "node", every node's launcher
# is given it; "kernel", the kernel keeps it, as it restarts, shows and times every node
# together; "cluster", the cluster decides it, so a value given for it is refused. Beside that:
# "launch", only a one-off launch takes it (a WorkerPool would lose its workers' state), and
# "worker", every worker's Accelerator reads it from its NOTEBOOK_KIT_<NAME> variable.
Scope = Literal["node", "kernel", "cluster", "launch", "worker"]
# How the ConfigPanel shows a setting: a dropdown of process counts, of choices, a bounded
# number box, or a text box (for numbers that may be left empty, "auto", and addresses).
Widget = Literal["processes", "choice", "count", "text"]


@dataclass(frozen=True)
class Setting:
    """One launch setting; what it accepts drives validation, parsing and every message.

    Attributes:
        name: The ``LaunchConfig`` field and JSON key.
        kind: What values are: an integer, a string, yes/no, one of ``choices``, or seconds.
        default: The built-in default (None: decided at launch time, "auto").
        help: One line, shown beside the panel field, in ``--help`` and by the questionnaire.
        annotation: The type a ``LaunchConfig`` field holds; the launcher takes it or None.
        optional: None is a valid value ("auto"), not only the absence of one.
        minimum, maximum: The range of an integer (None: unbounded), stated in every message.
        ceiling: A cap on an integer without a natural maximum, beyond which a value can only
            be a typo (``num_processes=10**9``); stated when a value exceeds it.
        choices: The words a choice is made from (without "auto").
        alias: The launcher's keyword when it differs from ``name`` (Accelerate's spelling).
        widget: How the panel shows it; ``placeholder`` is a text box's empty text.
        switch: A yes/no setting whose command-line option takes no value, as Accelerate's
            ``--use_fsdp``: ``--use-fsdp`` turns it on, ``--no-use-fsdp`` off.
        scope: Where it goes (:data:`Scope`); exactly one of "node", "kernel" and "cluster".
        cluster_decides: For scope "cluster": why the cluster decides it, said when refused.
    """

    name: str
    kind: Kind
    default: Any
    help: str
    annotation: Any
    optional: bool = False
    minimum: int | None = None
    maximum: int | None = None
    ceiling: int | None = None
    choices: tuple[str, ...] = ()
    alias: str | None = None
    widget: Widget = "text"
    placeholder: str = ""
    switch: bool = False
    scope: tuple[Scope, ...] = ("node",)
    cluster_decides: str = ""

    @property
    def upper(self) -> int | None:
        """The largest integer accepted, from the range or the ceiling."""
        return self.maximum if self.maximum is not None else self.ceiling

    @property
    def keyword(self) -> str:
        """The launcher's keyword argument for this setting."""
        return self.alias or self.name

    @property
    def flag(self) -> str:
        """The command-line option: ``num_processes`` -> ``--num-processes``."""
        return "--" + self.name.replace("_", "-")

    @property
    def off_flag(self) -> str:
        """A switch's option that turns it off: ``use_fsdp`` -> ``--no-use-fsdp``."""
        return "--no-" + self.flag[2:]

    @property
    def env_var(self) -> str:
        """The environment variable: ``num_processes`` -> ``NOTEBOOK_KIT_NUM_PROCESSES``."""
        return ENV_PREFIX + self.name.upper()


# The biggest nodes have 8-16 GPUs and a few hundred cores; a count beyond this is a typo. The
# machine's own limits (open files, processes, cores) are checked when a launch is planned.
MAX_PROCESSES = 1024
MAX_NODES = 4096


def _declare(*settings: Setting) -> dict[str, Setting]:
    return {setting.name: setting for setting in settings}


def _mesh_size(dim: str, what: str, ceiling: int = MAX_PROCESSES) -> Setting:
    """One of Accelerate's ``ParallelismConfig`` sizes: a count, 1 (off) by default."""
    return Setting(
        f"parallelism_config_{dim}_size", "int", 1, f"{what}; 1 = off.", int,
        minimum=1, ceiling=ceiling, widget="count", scope=("node", "worker"),
    )  # fmt: skip


_NODE_0_BINDS = "node 0 binds its own port on its own address"


SETTINGS: dict[str, Setting] = _declare(
    Setting(
        "num_processes", "int", None,
        "Worker processes on this node; auto = one per GPU, else 1.",
        int | None, optional=True, minimum=1, ceiling=MAX_PROCESSES, widget="processes",
    ),
    Setting(
        "mixed_precision", "choice", "no", "Autocast dtype for the forward pass: no, fp16 or bf16.",
        MixedPrecision, choices=MIXED_PRECISION_CHOICES, widget="choice", scope=("node", "worker"),
    ),
    Setting(
        "gradient_accumulation_steps", "int", 1,
        "Batches whose gradients add up before each optimizer step.",
        int, minimum=1, ceiling=4096, widget="count", scope=("node", "worker"),
    ),
    Setting(
        "backend", "choice", None,
        "torch.distributed backend; auto = nccl with GPUs, gloo on CPU.",
        Backend | None, optional=True, choices=BACKEND_CHOICES, widget="choice",
    ),
    # numpy and random accept seeds in [0, 2**32); torch accepts more, so the narrower range wins.
    Setting(
        "seed", "int", None,
        "Seed for torch, numpy and random in every worker; empty = do not seed.",
        int | None, optional=True, minimum=0, maximum=2**32 - 1, placeholder="none",
    ),
    Setting(
        "master_addr", "str", "127.0.0.1", "Address of node 0, reachable from every node.", str,
        scope=("cluster",), cluster_decides=_NODE_0_BINDS,
    ),
    Setting(
        "master_port", "int", None,
        "TCP port on node 0; empty = a free port on one node, 29500 across nodes.",
        int | None, optional=True, minimum=1, maximum=65535, alias="use_port",
        placeholder="auto (free port)", scope=("cluster",), cluster_decides=_NODE_0_BINDS,
    ),
    Setting(
        "num_nodes", "int", 1,
        "Machines taking part; run the same launch on each of them.",
        int, minimum=1, ceiling=MAX_NODES, widget="count", scope=("kernel",),
    ),
    Setting(
        "node_rank", "int", 0,
        "Index of this machine, 0 to num_nodes - 1; node 0 hosts master_addr.",
        int, minimum=0, ceiling=MAX_NODES - 1, widget="count", scope=("cluster",),
        cluster_decides="the kernel numbers the nodes, one per worker it chose on the cluster",
    ),
    Setting(
        "threads_per_process", "int", None,
        "CPU threads per worker; auto = cores divided by workers.",
        int | None, optional=True, minimum=1, placeholder="auto",
    ),
    Setting(
        "live", "bool", None,
        "Live plots, progress and a Stop button; auto = when a notebook shows them.",
        bool | None, optional=True, widget="choice", scope=("kernel",),
    ),
    Setting(
        "max_restarts", "int", 0,
        "Times a failed launch is restarted before the error is raised.",
        int, minimum=0, ceiling=100, widget="count", scope=("kernel", "launch"),
    ),
    Setting(
        "use_fsdp", "bool", False,
        "Shard models with FSDP2 in every worker's Accelerator (FSDP_* variables).",
        bool, alias="fsdp", widget="choice", switch=True, scope=("node", "worker"),
    ),
    # Accelerate's ParallelismConfig sizes; they multiply to the world size (docs/parallelism.md).
    _mesh_size(
        "dp_replicate", "Model replicas (HSDP: replicate across nodes, shard within)", MAX_NODES,
    ),
    _mesh_size("dp_shard", "Ranks each model is sharded over with FSDP2 (needs fsdp)"),
    _mesh_size("tp", "Ranks each layer is split over (tensor parallel)"),
    _mesh_size("cp", "Ranks each sequence is split over (context parallel, GPU)"),
    # Whole seconds, so the panel, the flag and the variable take it as they take any count.
    Setting(
        "storage_timeout", "int", 60,
        "Seconds a checkpoint's storage may stay silent before the save fails.",
        int, minimum=1, ceiling=3600, widget="count", scope=("node", "worker"),
    ),
    # A GPU's allocator only: refused before anything starts when the ranks would be on the CPU.
    Setting(
        "memory_history", "bool", False,
        "Record CUDA allocations; on out-of-memory, save them and name the largest.",
        bool, widget="choice", switch=True,
    ),
    # The kernel forks or asks its template. A cluster's node was started clean by its engine,
    # so its launcher always forks (launch/launchers/forked.py, ``seat``): a value is refused.
    Setting(
        "start_method", "choice", "auto",
        "Workers fork the kernel or its clean process; auto = fork when that is safe.",
        StartMethod, choices=START_METHOD_CHOICES, widget="choice", scope=("cluster",),
        cluster_decides="each node is started clean by its engine and forks its ranks",
    ),
)  # fmt: skip

CALL_SETTINGS: dict[str, Setting] = _declare(
    Setting(
        "timeout", "seconds", None,
        "Seconds after which the run is stopped and TimeoutError raised.",
        float | None, optional=True, scope=("kernel",),
    ),
    Setting(
        "rendezvous_timeout", "seconds", 300.0,
        "Seconds to wait for the other nodes to join.",
        float,
    ),
    Setting(
        "isolate", "bool", False,
        "Run a single process in a forked worker, not in this kernel.",
        bool, scope=("cluster", "launch"), cluster_decides="every node forks its ranks",
    ),
    Setting(
        "stall_seconds", "seconds", 60.0,
        "Seconds with no progress on any rank before the cell shows where each waits.",
        float | None, optional=True,
    ),
    Setting(
        "min_nodes", "int", None,
        "Fewest nodes a cluster run restarts on after losing some; empty = num_nodes.",
        int | None, optional=True, minimum=1, ceiling=MAX_NODES, scope=("kernel", "launch"),
    ),
    # Asked at the kernel's prompt: a cluster node's rank through its node, as its breakpoint().
    Setting(
        "post_mortem", "bool", False,
        "A rank that raises opens pdb in its failing frame, in the cell.",
        bool,
    ),
)  # fmt: skip


def scoped(scope: Scope) -> dict[str, Setting]:
    """The settings of the launcher (:data:`SETTINGS`, :data:`CALL_SETTINGS`) in ``scope``.

    Example:
        >>> list(scoped("launch"))
        ['max_restarts', 'isolate', 'min_nodes']
    """
    every = (*SETTINGS.values(), *CALL_SETTINGS.values())
    return {setting.name: setting for setting in every if scope in setting.scope}


def choice_words(name: str) -> tuple[str, ...]:
    """The words setting ``name`` is chosen from, "auto" first when optional; empty for others.

    Example:
        >>> choice_words("backend"), choice_words("seed")
        (('auto', 'gloo', 'nccl'), ())
    """
    setting = SETTINGS[name]
    words: tuple[str, ...] = ()
    if setting.kind == "choice":
        words = setting.choices
    elif setting.kind == "bool":
        words = ("yes", "no")
    return ("auto", *words) if words and setting.optional else words


def allowed_values(setting: Setting, value: Any = None) -> str:
    """Describe the values a setting accepts, for error messages and prompts.

    A ceiling is named only to the ``value`` above it: below it, it would only be noise.
    """
    if setting.kind == "choice":
        text = "one of " + ", ".join(repr(word) for word in choice_words(setting.name))
        return text + " (None means 'auto')" if setting.optional else text
    if setting.kind == "bool":
        return "True, False or None (auto)" if setting.optional else "True or False"
    if setting.kind == "str":
        return "a non-empty host name or IP address"
    if setting.kind == "seconds":
        return "a positive number of seconds" + (" or None" if setting.optional else "")
    above = isinstance(value, int) and setting.upper is not None and value > setting.upper
    if setting.maximum is not None or above:
        text = f"an integer from {setting.minimum} to {setting.upper}"
    else:
        text = f"an integer >= {setting.minimum}"
    return text + " or None (auto)" if setting.optional else text


def check_value(name: str, value: Any) -> Any:
    """Return ``value`` normalised for the ``LaunchConfig`` field ``name``, or raise.

    Raises:
        TypeError: The value has the wrong type; the message names the field and the fix.
        ValueError: The value is out of range or not one of the choices.
    """
    setting = SETTINGS[name]
    problem = f"{name} must be {allowed_values(setting, value)}; got {value!r}"
    if value is None or (setting.optional and setting.kind == "choice" and value == "auto"):
        if setting.optional:
            return None
        raise TypeError(problem + ".")
    if setting.kind == "bool":
        if not isinstance(value, bool):
            raise TypeError(f"{problem} ({type(value).__name__}).")
        return value
    if setting.kind in ("str", "choice"):
        if not isinstance(value, str):
            raise TypeError(f"{problem} ({type(value).__name__}).")
        if setting.kind == "choice" and value not in setting.choices:
            raise ValueError(problem + ".")
        if setting.kind == "str" and (not value or value != value.strip() or " " in value):
            raise ValueError(problem + ".")
        return value
    # bool is an int subclass, but True workers or a False port is always a mistake.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{problem} ({type(value).__name__}).")
    value = int(value)
    if (setting.minimum is not None and value < setting.minimum) or (
        setting.upper is not None and value > setting.upper
    ):
        raise ValueError(problem + ".")
    return value


def check_argument(setting: Setting, value: Any) -> Any:
    """Check a value given to the launcher, naming the keyword as the caller spelled it.

    None means "not given" and is returned as it is.
    """
    if value is None:
        return None
    keyword = setting.keyword
    if setting.kind == "int":
        low = setting.minimum if setting.minimum is not None else 0
        return arguments.check_int(keyword, value, minimum=low, maximum=setting.upper)
    if setting.kind == "choice":
        return arguments.check_choice(keyword, value, setting.choices)
    if setting.kind == "bool":
        return arguments.check_bool(keyword, value)
    if setting.kind == "seconds":
        return arguments.check_timeout(value, keyword)
    return arguments.check_master_addr(value)


def parse_text(name: str, text: str) -> Any:
    """Turn what a person typed into a value for setting ``name`` (validated).

    ``auto``, ``none`` or an empty answer mean None for optional settings.

    Example:
        >>> parse_text("master_port", "29500"), parse_text("seed", "")
        (29500, None)
    """
    setting = SETTINGS[name]
    text = text.strip()
    if setting.optional and text.lower() in _AUTO_WORDS:
        return None
    value: Any = text
    if setting.kind == "int":
        try:
            value = int(text)
        except ValueError:
            problem = f"{name} must be {allowed_values(setting)}; got {text!r}."
            raise ValueError(problem) from None
    elif setting.kind == "bool":
        if text.lower() not in _YES_NO:
            raise ValueError(f"{name} must be auto, yes or no; got {text!r}.")
        value = _YES_NO[text.lower()]
    return check_value(name, value)


def settings_from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings given as ``NOTEBOOK_KIT_<NAME>`` variables, parsed and checked.

    Raises:
        ValueError: A variable's value is unusable; the message names the variable.

    Example:
        >>> settings_from_environ({"NOTEBOOK_KIT_SEED": "3"})
        {'seed': 3}
    """
    values = {}
    for name, setting in SETTINGS.items():
        text = environ.get(setting.env_var)
        if text is None:
            continue
        try:
            values[name] = parse_text(name, text)
        except (TypeError, ValueError) as error:
            raise ValueError(f"${setting.env_var}={text!r}: {error}") from error
    return values
