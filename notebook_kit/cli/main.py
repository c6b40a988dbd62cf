"""The ``notebook-kit`` command: ``config`` writes the saved default, ``env`` reports the machine,
``launch`` runs a script on many processes, ``export`` turns a notebook into such a script.

Each subcommand is a ``_run_<name>`` handler and a ``_<name>_options`` function (one row of
:data:`_SUBCOMMANDS`), with its texts in :data:`_ABOUT`. Launch options shared with scripts are
added by :func:`add_launch_config_arguments`, one ``--option-name`` per LaunchConfig field, so
the command line, the panel's rendered command and the config file always agree.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from notebook_kit.config.arguments import loopback_master_problem
from notebook_kit.config.command_line import answer_text
from notebook_kit.config.launch_config import (
    LaunchConfig,
    default_config_path,
    field_errors,
    saved_default,
)
from notebook_kit.config.schema import SETTINGS, choice_words, parse_text

__all__ = [
    "add_launch_config_arguments",
    "build_parser",
    "config_from_arguments",
    "main",
]

_MULTI_NODE_FIELDS = ("node_rank", "master_addr", "master_port")


def _argument_type(field: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse_text(field, text)
        except (TypeError, ValueError) as error:
            raise argparse.ArgumentTypeError(str(error)) from error

    convert.__name__ = field  # argparse names the type in some messages
    return convert


def add_launch_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one option per LaunchConfig field; options not given stay absent from the namespace.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_launch_config_arguments(parser)
        >>> vars(parser.parse_args(["--num-processes", "2"]))
        {'num_processes': 2}
    """
    group = parser.add_argument_group("launch settings (unset ones come from the saved default)")
    for field, setting in SETTINGS.items():
        if setting.switch:  # a plain flag, and its --no- form over a saved default
            group.add_argument(  # BooleanOptionalAction adds the off_flag
                setting.flag,
                dest=field,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=setting.help,
            )
            continue
        group.add_argument(
            setting.flag,
            type=_argument_type(field),
            default=argparse.SUPPRESS,
            metavar=field.upper(),
            help=setting.help,
        )


def _given(namespace: argparse.Namespace) -> dict[str, Any]:
    """The LaunchConfig fields present in ``namespace`` (options given on the command line)."""
    return {field: getattr(namespace, field) for field in SETTINGS if hasattr(namespace, field)}


def config_from_arguments(
    namespace: argparse.Namespace, base: LaunchConfig | None = None
) -> LaunchConfig:
    """The options given on the command line applied over ``base`` (default: the saved default).

    Example:
        >>> config_from_arguments(argparse.Namespace(seed=3), LaunchConfig()).seed
        3
    """
    start = base if base is not None else saved_default() or LaunchConfig()
    return start.replace(**_given(namespace))


def _ask(field: str, current: Any, answers: dict[str, Any]) -> Any:
    """Ask for one field until the answer is valid; Enter keeps ``current``."""
    shown = "none" if field == "seed" and current is None else answer_text(current)
    words = choice_words(field)
    choices = f" ({'/'.join(words)})" if words else ""
    print(f"\n{SETTINGS[field].help}")
    while True:
        text = input(f"{field}{choices} [{shown}]: ")
        if not sys.stdin.isatty():
            print(text)  # piped answers are not echoed; keep the transcript readable
        try:
            value = current if not text.strip() else parse_text(field, text)
        except (TypeError, ValueError) as error:
            print(f"  {error} Please try again.")
            continue
        # Fields asked earlier (num_nodes before node_rank) constrain later ones.
        problem = field_errors({**answers, field: value}).get(field)
        if problem is None and field == "master_addr":  # a saved default is never explicit
            nodes = answers.get("num_nodes", 1)
            problem = loopback_master_problem(nodes, value, "as the saved default", cli=True)
        if problem is None:
            return value
        print(f"  {problem} Please try again.")


def _questionnaire(start: LaunchConfig) -> LaunchConfig:
    """Ask every question in an order where each answer can be checked at once."""
    answers: dict[str, Any] = {"num_nodes": _ask("num_nodes", start.num_nodes, {})}
    if answers["num_nodes"] > 1:
        for field in _MULTI_NODE_FIELDS:
            answers[field] = _ask(field, getattr(start, field), answers)
    else:
        answers["node_rank"] = 0
    for field in SETTINGS:
        if field not in answers and field not in _MULTI_NODE_FIELDS:
            answers[field] = _ask(field, getattr(start, field), answers)
    return start.replace(**answers)


# Each subcommand's line in `notebook-kit --help`, and what its own --help says first.
_ABOUT: dict[str, tuple[str, str]] = {
    "config": (
        "write the saved default launch config by answering questions",
        "Ask for every launch setting and save the answers as the default config.",
    ),
    "env": (
        "report torch, CPUs, GPUs, backends, fork-safety and the saved config",
        "Report what this machine offers a launch and where the saved config lives.",
    ),
    "launch": (
        "run a script on every process of this node through torch.distributed.run",
        "Run SCRIPT on NUM_PROCESSES processes per node with torchrun's elastic "
        "agent. In a SLURM or Coiled Batch job the node rank, number of nodes and node 0's "
        "address come from the scheduler; options given here win.",
    ),
    "export": (
        "write a notebook's code as a script that runs under notebook-kit launch",
        "Write the code cells of NOTEBOOK as a script; magics, display-only "
        "statements and cells tagged skip-export are left out, and the cells from the first "
        "notebook_launcher call on become main().",
    ),
    "execute": (
        "run a notebook top to bottom in a fresh kernel, headless, printing its output",
        "Run every cell of a notebook in a new kernel; stop at the first error.",
    ),
    "merge-weights": (
        "merge a sharded (FSDP) checkpoint into one model.safetensors",
        "Merge the model shards save_state wrote under FSDP into OUTPUT/"
        "model.safetensors, which load_state_dict and from_pretrained read; no processes "
        "are started.",
    ),
}


def _error(command: str, error: object) -> int:
    """Say what was wrong with a ``notebook-kit`` call; 2 is argparse's status for usage errors."""
    print(f"notebook-kit {command}: error: {error}", file=sys.stderr)
    return 2


def _run_config(args: argparse.Namespace) -> int:
    path = Path(args.path) if args.path else default_config_path()
    if args.default:
        LaunchConfig().save(path)
        print(f"Wrote the built-in defaults to {path}")
        return 0
    start = LaunchConfig()
    try:
        start = LaunchConfig.load(path) if path.is_file() else start
    except (TypeError, ValueError) as error:
        print(f"Ignoring the unreadable config file; starting from built-in defaults.\n{error}")
    print(f"Configuring {path}. Press Enter to keep the value in [brackets].")
    try:
        config = _questionnaire(start)
    except EOFError:
        print("\nNo more answers on standard input; nothing was written.", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nInterrupted; nothing was written.", file=sys.stderr)
        return 130
    config.save(path)
    print(f"\nWrote {path}")
    return 0


def _config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--default", action="store_true", help="write the built-in defaults without asking"
    )
    parser.add_argument(
        "--path", help="file to write instead of the default location (see `notebook-kit env`)"
    )


def _run_env(args: argparse.Namespace) -> int:
    from notebook_kit.config.environment import environment  # imports torch: only when asked for

    report = environment()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.to_text())
    return 0


def _env_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


_NO_SCRIPT = """\
notebook-kit launch: error: name the script to run, after any options, for example:
  notebook-kit launch --num-processes 2 train.py --epochs 3
Everything after the script goes to the script. To run a notebook, export it first:
  notebook-kit export train.ipynb && notebook-kit launch train.py
See `notebook-kit launch --help` for every option."""


def _run_launch(args: argparse.Namespace) -> int:
    from notebook_kit.cli.script_launch import (
        LaunchInputError,
        plan_script_launch,
        run_script_launch,
    )

    if args.script is None:
        print(_NO_SCRIPT, file=sys.stderr)
        return 2
    try:
        launch = plan_script_launch(args.script, args.script_args, _given(args), args.config)
    except LaunchInputError as error:
        return _error("launch", error)
    if args.dry_run:
        print(f"{launch.banner()}\n{launch.command_line()}")
        return 0
    return run_script_launch(launch)


def _launch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", help="LaunchConfig JSON file (default: the saved default)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the torchrun command; start nothing"
    )
    add_launch_config_arguments(parser)
    # Optional for argparse so that a missing script gets an example, not "required: ...".
    parser.add_argument("script", nargs="?", help="the Python script to run on every process")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def _run_export(args: argparse.Namespace) -> int:
    from notebook_kit.cli.batch_scripts import BatchRequest, write_batch_script
    from notebook_kit.cli.export import ExportError, export_notebook

    kinds = [kind for kind in ("coiled", "slurm") if getattr(args, f"{kind}_batch")]
    try:  # the request is checked before anything is written
        request = BatchRequest(args.nodes, args.num_processes, args.gpus, args.master_port)
    except ValueError as error:
        return _error("export", error)
    if not kinds and (args.gpus or args.nodes_given):
        return _error(
            "export",
            "--nodes, --num-processes, --gpus and --master-port size a batch script: "
            "add --coiled-batch or --slurm",
        )
    try:
        result = export_notebook(args.notebook, args.output)
        written = [write_batch_script(kind, result.path, request) for kind in kinds]
    except (ExportError, OSError) as error:
        return _error("export", error)
    print(result.summary())
    for path in written:
        print(f"Wrote {path}")
    return 0


class _Given(argparse.Action):
    """Stores the value and notes that a batch-script size was given on the command line."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        setattr(namespace, self.dest, values)
        namespace.nodes_given = True


def _export_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebook", help="the .ipynb file")
    parser.add_argument("-o", "--output", help="script to write (default: NOTEBOOK with .py)")
    batch = parser.add_argument_group(
        "batch scripts", "also write a script that runs the export on several machines"
    )
    batch.add_argument(
        "--coiled-batch",
        action="store_true",
        help="write SCRIPT.sh for coiled batch run (#COILED directives, one task per VM)",
    )
    batch.add_argument(
        "--slurm",
        dest="slurm_batch",
        action="store_true",
        help="write SCRIPT.sbatch for sbatch (one srun task per node)",
    )
    batch.add_argument("--nodes", type=int, default=2, action=_Given, help="nodes (default 2)")
    batch.add_argument(
        "--num-processes", type=int, default=1, action=_Given, help="processes per node"
    )
    batch.add_argument("--gpus", action="store_true", help="one GPU per process")
    batch.add_argument(
        "--master-port", type=int, default=29500, action=_Given, help="port on node 0"
    )
    parser.set_defaults(nodes_given=False)


def _run_execute(args: argparse.Namespace) -> int:
    from nbclient.exceptions import CellExecutionError

    from notebook_kit.cli.notebook_file import NotebookFileError
    from notebook_kit.cli.notebook_runner import execute_notebook

    try:
        execute_notebook(args.notebook, output=args.output, timeout=args.timeout)
    except CellExecutionError as error:
        print(f"notebook-kit execute: a cell failed:\n{error}", file=sys.stderr)
        return 1
    except (FileNotFoundError, IsADirectoryError, NotebookFileError) as error:
        return _error("execute", error)
    return 0


def _execute_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebook", type=Path, help="the .ipynb file to run")
    parser.add_argument("-o", "--output", type=Path, help="save the executed notebook here")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one cell may take")


def _run_merge_weights(args: argparse.Namespace) -> int:
    from notebook_kit.accelerator.checkpoint_files import CheckpointError
    from notebook_kit.accelerator.model_files import merge_sharded_weights

    try:
        written = merge_sharded_weights(args.checkpoint, args.output)
    except (FileNotFoundError, CheckpointError) as error:
        return _error("merge-weights", error)
    print(f"Wrote {written}")
    return 0


def _merge_weights_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="the checkpoint folder save_state wrote")
    parser.add_argument("output", type=Path, help="the folder to write model.safetensors into")


# name -> (what runs it, what adds its options); its texts are in _ABOUT.
_SUBCOMMANDS = {
    "config": (_run_config, _config_options),
    "env": (_run_env, _env_options),
    "launch": (_run_launch, _launch_options),
    "export": (_run_export, _export_options),
    "execute": (_run_execute, _execute_options),
    "merge-weights": (_run_merge_weights, _merge_weights_options),
}


def build_parser() -> argparse.ArgumentParser:
    """The ``notebook-kit`` argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="notebook-kit", description="Distributed PyTorch training from notebooks."
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, (handler, add_options) in _SUBCOMMANDS.items():
        help_line, description = _ABOUT[name]
        command = commands.add_parser(name, help=help_line, description=description)
        command.set_defaults(handler=handler)
        add_options(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``notebook-kit`` command line and return its exit status.

    Example::

        main(["config", "--default"])
        # 0
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
