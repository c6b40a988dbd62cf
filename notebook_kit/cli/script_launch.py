"""``notebook-kit launch``: run a script on every process of a node through torch's launcher.

The processes are started by ``torch.distributed.run`` (torchrun's elastic agent), called in
this process with an argument list built from the launch config:

- the list goes through torchrun's own parser, so every value means exactly what it means to
  ``torchrun`` (and ``--dry-run`` prints the equivalent ``torchrun`` command);
- a failure comes back as torchrun's ``ChildFailedError`` (rank, exit code, pid) and is
  reported in a few lines rather than torchrun's table;
- no extra interpreter sits between a Ctrl-C or a scheduler's SIGTERM and the agent.

Workers get the environment a notebook launch gives its workers (threads per process,
mixed precision, gradient accumulation, gloo on loopback for one node), so a script built on
``Accelerator`` behaves as it does in the notebook.

Settings are taken, first found first: options on the command line, the node placement a
batch scheduler gives (:mod:`notebook_kit.config.placement`), ``--config FILE`` or else the
``NOTEBOOK_KIT_<NAME>`` variables over the saved default, then the built-in defaults.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from notebook_kit.config.arguments import is_loopback, loopback_master_problem
from notebook_kit.config.command_line import option_name
from notebook_kit.config.environment import gpu_count
from notebook_kit.config.launch_config import LaunchConfig, field_errors, read_saved_default
from notebook_kit.config.launch_plan import auto_process_count, auto_threads, worker_environment
from notebook_kit.config.placement import (
    DEFAULT_MASTER_PORT,
    NodePlacement,
    PlacementError,
    detect_node,
)
from notebook_kit.config.process_limits import check_process_count
from notebook_kit.config.schema import SETTINGS, settings_from_environ
from notebook_kit.errors import is_consequence
from notebook_kit.launch.plan import parallelism_sizes

__all__ = ["LaunchInputError", "ScriptLaunch", "plan_script_launch", "run_script_launch"]


class LaunchInputError(ValueError):
    """An option, a config file or a scheduler variable is unusable; nothing was started."""


@dataclass(frozen=True)
class ScriptLaunch:
    """A checked ``notebook-kit launch``: what torchrun is asked to run, and with what.

    Attributes:
        config: The resolved launch settings.
        num_processes: Processes on this node (``config.num_processes`` with auto resolved).
        threads: torch/OpenMP threads per process.
        script: The script, as given.
        script_args: Arguments passed on to the script.
        placement: Where a batch scheduler put this node, when one did.
    """

    config: LaunchConfig
    num_processes: int
    threads: int
    script: str
    script_args: tuple[str, ...] = ()
    placement: NodePlacement | None = None

    def torchrun_arguments(self) -> list[str]:
        """The ``torchrun`` arguments for this launch.

        One node without a port uses torchrun's standalone rendezvous on a free port (as a
        notebook launch picks a free port). Several nodes use the static rendezvous at node 0,
        which honours ``--node-rank``; with restarts they use torch's c10d rendezvous there
        instead, the one that can re-form the group after a failure (it numbers the nodes in
        the order they join).

        Example::

            launch = ScriptLaunch(LaunchConfig(num_processes=2), 2, 1, "train.py")
            launch.torchrun_arguments()
            # ['--nproc-per-node', '2', '--max-restarts', '0', '--standalone', 'train.py']
        """
        config = self.config
        words = ["--nproc-per-node", str(self.num_processes)]
        words += ["--max-restarts", str(config.max_restarts)]
        port = str(config.master_port or DEFAULT_MASTER_PORT)
        if config.num_nodes > 1 and config.max_restarts > 0:
            words += ["--nnodes", str(config.num_nodes), "--rdzv-backend", "c10d"]
            words += ["--rdzv-endpoint", f"{config.master_addr}:{port}"]
            words += ["--rdzv-id", f"notebook-kit-{port}"]
        elif config.num_nodes > 1:
            words += ["--nnodes", str(config.num_nodes), "--node-rank", str(config.node_rank)]
            words += ["--master-addr", config.master_addr, "--master-port", port]
        elif config.master_port is not None:
            words += ["--master-addr", "127.0.0.1", "--master-port", str(config.master_port)]
        else:
            words.append("--standalone")
        # Every process runs the script through script_entry, which ends it cleanly.
        return [*words, "-m", "notebook_kit.cli.script_entry", self.script, *self.script_args]

    def banner(self) -> str:
        """One line saying what is about to start."""
        config = self.config
        noun = "process" if self.num_processes == 1 else "processes"
        text = f"notebook-kit launch: {self.num_processes} {noun} of {self.script} on this node"
        if config.num_nodes > 1:
            world = config.num_nodes * self.num_processes
            text += f" (node {config.node_rank} of {config.num_nodes}, world size {world})"
            if is_loopback(config.master_addr):
                address = config.master_addr
                text += f"; every node on this machine (master_addr {address} is loopback)"
        if self.placement is not None:
            text += f"; {self.placement.describe()}"
        threads = "thread" if self.threads == 1 else "threads"
        return f"{text}; {self.threads} {threads} each, via torch.distributed.run"

    def command_line(self) -> str:
        """The equivalent shell command (environment assignments, then ``torchrun``).

        Example:
            >>> ScriptLaunch(LaunchConfig(), 1, 2, "t.py").command_line().split()[0]
            'OMP_NUM_THREADS=2'
        """
        environment = worker_environment(self.config, self.threads)
        assignments = [f"{name}={value}" for name, value in environment.items()]
        words = [*assignments, "torchrun", *self.torchrun_arguments()]
        return " ".join(shlex.quote(word) for word in words)


def _base_config(config_path: str | None) -> tuple[LaunchConfig, str]:
    """The config file's settings (or the saved default's), and where they came from."""
    if config_path is None:
        saved, problem = read_saved_default()
        if problem is not None:
            raise LaunchInputError(f"saved default config: {problem}") from problem
        return (saved, "the saved default") if saved else (LaunchConfig(), "built-in defaults")
    path = Path(config_path)
    if not path.is_file():
        raise LaunchInputError(f"--config: no such file: {config_path}")
    try:
        return LaunchConfig.load(path), f"--config {config_path}"
    except (OSError, TypeError, ValueError) as error:
        raise LaunchInputError(f"--config: {error}") from error


def _placement_values(placement: NodePlacement | None) -> dict[str, Any]:
    if placement is None:
        return {}
    values = {name: getattr(placement, name) for name in SETTINGS if hasattr(placement, name)}
    return {name: value for name, value in values.items() if value is not None}


def _check_switch_value(script: str, script_args: Sequence[str], given: Mapping[str, Any]) -> None:
    """``--use-fsdp yes train.py``: a switch takes no value, so "yes" was read as the script."""
    switches = [SETTINGS[field] for field in given if SETTINGS[field].switch]
    if switches and script.strip().lower() in ("yes", "no", "true", "false", "1", "0"):
        flag, after = switches[0], " ".join(script_args) or "train.py"
        raise LaunchInputError(
            f"{flag.flag} takes no value ({script!r} was read as the script): write "
            f"`notebook-kit launch {flag.flag} {after}`, or {flag.off_flag} to turn it off."
        )


def plan_script_launch(
    script: str,
    script_args: Sequence[str] = (),
    given: Mapping[str, Any] | None = None,
    config_path: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ScriptLaunch:
    """Check everything and resolve the settings of a launch; nothing is started.

    Args:
        script: Path of the Python script to run on every process.
        script_args: Arguments for the script.
        given: LaunchConfig fields given explicitly (command-line options); they win.
        config_path: A LaunchConfig JSON file; default: the saved default config.
        environ: Where scheduler variables are read (default ``os.environ``).

    Raises:
        LaunchInputError: Names the option, file or variable at fault.

    Example::

        plan_script_launch("train.py", given={"num_processes": 2}).num_processes
        # 2
    """
    given = dict(given or {})
    base, base_origin = _base_config(config_path)
    try:
        # An explicit --num-nodes describes the whole job; a scheduler's guess would only clash.
        placement = None if "num_nodes" in given else detect_node(environ)
    except PlacementError as error:
        raise LaunchInputError(f"{error} (or give --num-nodes and --node-rank)") from error
    from_scheduler = {k: v for k, v in _placement_values(placement).items() if k not in given}
    from_environ = _environ_settings(environ) if config_path is None else {}
    values = {**base.to_dict(), **from_environ, **from_scheduler, **given}
    origins = {field: f" ({field} from {base_origin})" for field in values}
    origins.update({field: f" ({field} from ${SETTINGS[field].env_var})" for field in from_environ})
    origins.update({field: f" ({field} from {placement.source})" for field in from_scheduler})
    origins.update({field: "" for field in given})
    problems = field_errors(values)
    if problems:
        field, message = next(iter(problems.items()))
        raise LaunchInputError(f"{option_name(field)}: {message.rstrip('.')}{origins[field]}.")
    config = LaunchConfig.from_dict(values)
    if "master_addr" not in given and "master_addr" not in from_scheduler:
        origin = origins["master_addr"].strip().removeprefix("(master_addr ").removesuffix(")")
        problem = loopback_master_problem(config.num_nodes, config.master_addr, origin, cli=True)
        if problem:
            raise LaunchInputError(f"--master-addr: {problem}")
    if not Path(script).is_file():
        _check_switch_value(script, script_args, given)
        raise LaunchInputError(f"script: no such file: {script}")
    num_processes = config.num_processes or auto_process_count(gpu_count())  # no CUDA here
    try:
        check_process_count(num_processes)
    except ValueError as error:
        raise LaunchInputError(f"{option_name('num_processes')}: {error}") from error
    try:  # the mesh must fit the nodes before torchrun starts anything
        parallelism_sizes(config, num_processes)
    except ValueError as error:
        raise LaunchInputError(str(error)) from error
    if config.memory_history:  # the script's own code owns its processes' CUDA allocator
        raise LaunchInputError(
            f"{option_name('memory_history')}: a script records its GPU memory itself "
            "(torch.cuda.memory._record_memory_history); memory_history is for notebook_launcher "
            f"and WorkerPool. Leave it out{origins['memory_history']}."
        )
    if config.start_method != "auto":  # torchrun starts the script's processes itself
        raise LaunchInputError(
            f"{option_name('start_method')}: torchrun starts a script's processes itself; "
            "start_method is for notebook_launcher and WorkerPool. Leave it out"
            f"{origins['start_method']}."
        )
    threads = config.threads_per_process or _exported_threads() or auto_threads(num_processes)
    return ScriptLaunch(config, num_processes, threads, script, tuple(script_args), placement)


def _environ_settings(environ: Mapping[str, str] | None) -> dict[str, Any]:
    """The NOTEBOOK_KIT_<NAME> settings; they apply over the saved default, not --config."""
    try:
        return settings_from_environ(os.environ if environ is None else environ)
    except ValueError as error:
        raise LaunchInputError(str(error)) from error


def _exported_threads() -> int | None:
    """An OMP_NUM_THREADS the user exported wins over sharing out the cores."""
    exported = os.environ.get("OMP_NUM_THREADS", "")
    return int(exported) if exported.isdigit() and int(exported) > 0 else None


def run_script_launch(launch: ScriptLaunch) -> int:
    """Run the launch through ``torch.distributed.run`` and return the exit status.

    Returns 0 on success, 1 when a worker failed (after any restarts), 128 + the signal
    number when this process was stopped by a signal.

    Example::

        run_script_launch(plan_script_launch("train.py", given={"num_processes": 2}))
        # 0
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    print(launch.banner(), flush=True)
    os.environ.update(worker_environment(launch.config, launch.threads))
    try:
        run(parse_args(launch.torchrun_arguments()))
    except ChildFailedError as failure:
        print(_failure_report(failure, launch), file=sys.stderr, flush=True)
        return 1
    except SignalException as stopped:
        print(f"notebook-kit launch: stopped by {stopped.sigval.name}.", file=sys.stderr)
        return 128 + int(stopped.sigval)
    return 0


def _failure_report(failure: Any, launch: ScriptLaunch) -> str:
    """The failed rank to blame in a few lines; its traceback was printed above by the worker.

    torchrun orders failures by error-file timestamps of one-second resolution; a rank whose
    error only says that a peer went away is never the one to blame while another failed.
    """
    rank, first = failure.get_first_failure()
    causes = {
        failed_rank: failed
        for failed_rank, failed in failure.failures.items()
        if not is_consequence("", str(failed.message))
    }
    if causes and rank not in causes:
        rank, first = min(causes.items(), key=lambda item: item[1].timestamp)
    world = launch.num_processes * launch.config.num_nodes
    how = (
        f"was killed by {first.signal_name()}"
        if first.exitcode < 0
        else f"exited with code {first.exitcode}"
    )
    restarts = launch.config.max_restarts
    after = f" after {restarts} restart{'s' if restarts != 1 else ''}" if restarts else ""
    others = len(failure.failures) - 1
    lines = [
        f"notebook-kit launch: rank {rank} of {world} (pid {first.pid}) {how}{after}; "
        f"torchrun stopped the other workers of this node.",
        "The failing rank's traceback is printed above.",
    ]
    if others > 0:
        lines.append(f"{others} other rank(s) failed too, most likely as a consequence.")
    if restarts == 0:
        lines.append("Pass --max-restarts K to restart the workers after a failure.")
    return "\n".join(lines)
