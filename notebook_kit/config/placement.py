"""Where a node or a process stands in a batch job, read from the scheduler's environment.

Two levels are covered:

- **Node level**, for ``notebook-kit launch`` started once per machine: :func:`detect_node` reads
  the node rank, the number of nodes and node 0's address from torchrun's ``PET_*`` variables,
  from SLURM (one task per node) or from Coiled Batch, so a batch script needs no hand-filled
  ranks. Options given on the command line still win.
- **Process level**, for a script started directly by ``srun`` with one task per process:
  :func:`slurm_process_environment` turns ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``
  into the ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_*`` variables torch reads.

Everything here reads a mapping (``os.environ`` by default) and changes nothing, so each rule
is testable with a plain dict.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_MASTER_PORT",
    "NodePlacement",
    "PlacementError",
    "detect_node",
    "first_host",
    "slurm_process_environment",
]

DEFAULT_MASTER_PORT = 29500

PlacementSource = Literal["torchrun", "slurm", "coiled"]


class PlacementError(ValueError):
    """The scheduler's variables are present but unusable (the message names them)."""


@dataclass(frozen=True)
class NodePlacement:
    """This node's place in a multi-node job, as a scheduler described it.

    Attributes:
        source: Which scheduler's variables were read.
        num_nodes: Machines in the job.
        node_rank: Index of this machine, 0 to ``num_nodes - 1``.
        master_addr: Address of node 0.
        master_port: Rendezvous port, when the scheduler names one.
        num_processes: Processes per node, when the scheduler names them (torchrun only).
    """

    source: PlacementSource
    num_nodes: int
    node_rank: int
    master_addr: str
    master_port: int | None = None
    num_processes: int | None = None

    def describe(self) -> str:
        """One line for the launch banner.

        Example:
            >>> NodePlacement("slurm", 2, 1, "gpu01").describe()
            'node 1 of 2 from SLURM, node 0 at gpu01'
        """
        names = {"torchrun": "torchrun's PET_* variables", "slurm": "SLURM", "coiled": "Coiled"}
        return (
            f"node {self.node_rank} of {self.num_nodes} from {names[self.source]}, "
            f"node 0 at {self.master_addr}"
        )


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list, without calling ``scontrol``.

    Brackets hold comma-separated numbers or ranges; their text is kept as written, so
    zero padding survives. Several bracket groups in one name are expanded left to right.

    Raises:
        PlacementError: The list is empty or its brackets do not match.

    Example:
        >>> first_host("gpu[01-04],cpu7"), first_host("rack[2-3]-n[08,10]")
        ('gpu01', 'rack2-n08')
    """
    text, index, parts = nodelist.strip(), 0, []
    while index < len(text) and text[index] != ",":
        if text[index] == "[":
            close = text.find("]", index)
            inside = text[index + 1 : close] if close > 0 else "["
            if "[" in inside or not inside:
                break
            parts.append(inside.split(",")[0].split("-")[0])
            index = close + 1
        elif text[index] == "]":
            break
        else:
            parts.append(text[index])
            index += 1
    else:
        if parts:
            return "".join(parts)
    raise PlacementError(f"Cannot read the first host of the SLURM node list {nodelist!r}.")


def _integer(environ: Mapping[str, str], name: str, minimum: int) -> int:
    text = environ[name]
    try:
        value = int(text)
    except ValueError:
        raise PlacementError(f"{name}={text!r} is not an integer.") from None
    if value < minimum:
        raise PlacementError(f"{name}={text!r} must be >= {minimum}.")
    return value


def _first_present(environ: Mapping[str, str], *names: str) -> str | None:
    return next((name for name in names if environ.get(name, "") != ""), None)


def _from_torchrun(environ: Mapping[str, str]) -> NodePlacement | None:
    """``PET_NNODES`` etc.: what torchrun itself would read (e.g. set by a Kubernetes operator)."""
    if _first_present(environ, "PET_NNODES") is None:
        return None
    nodes = environ["PET_NNODES"]
    if ":" in nodes:
        raise PlacementError(
            f"PET_NNODES={nodes!r} asks for an elastic range; notebook-kit launch needs a fixed "
            "number of nodes. Set --num-nodes, or run torchrun directly for elastic jobs."
        )
    port = environ.get("PET_MASTER_PORT")
    processes = environ.get("PET_NPROC_PER_NODE", "")
    return NodePlacement(
        source="torchrun",
        num_nodes=_integer(environ, "PET_NNODES", 1),
        node_rank=_integer(environ, "PET_NODE_RANK", 0) if "PET_NODE_RANK" in environ else 0,
        master_addr=environ.get("PET_MASTER_ADDR") or "127.0.0.1",
        master_port=_integer(environ, "PET_MASTER_PORT", 1) if port else None,
        num_processes=_integer(environ, "PET_NPROC_PER_NODE", 1) if processes.isdigit() else None,
    )


def _from_slurm(environ: Mapping[str, str]) -> NodePlacement | None:
    """A SLURM step with one task per node: that task starts the node's processes."""
    nodes_name = _first_present(environ, "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    if nodes_name is None or _first_present(environ, "SLURM_NODEID") is None:
        return None
    num_nodes = _integer(environ, nodes_name, 1)
    tasks_name = _first_present(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if tasks_name is not None and _integer(environ, tasks_name, 1) > num_nodes:
        raise PlacementError(
            f"{tasks_name}={environ[tasks_name]} tasks on {nodes_name}={num_nodes} nodes: "
            "notebook-kit launch starts every process of its node itself, so run it once per "
            "node (srun --ntasks-per-node=1), or start the script directly with srun instead."
        )
    list_name = _first_present(environ, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if list_name is None:
        raise PlacementError("SLURM_NODEID is set but SLURM_JOB_NODELIST is missing.")
    return NodePlacement(
        source="slurm",
        num_nodes=num_nodes,
        node_rank=_integer(environ, "SLURM_NODEID", 0),
        master_addr=first_host(environ[list_name]),
    )


def _from_coiled(environ: Mapping[str, str]) -> NodePlacement | None:
    """Coiled Batch: one task per VM; the scheduler VM is node 0."""
    if _first_present(environ, "COILED_BATCH_TASK_ID") is None:
        return None
    address = environ.get("COILED_BATCH_SCHEDULER_ADDRESS", "")
    if not address:
        raise PlacementError(
            "COILED_BATCH_TASK_ID is set but COILED_BATCH_SCHEDULER_ADDRESS is not; give "
            "--master-addr, or run the batch job with a task on the scheduler."
        )
    return NodePlacement(
        source="coiled",
        num_nodes=_integer(environ, "COILED_BATCH_TASK_COUNT", 1),
        node_rank=_integer(environ, "COILED_BATCH_TASK_ID", 0),
        master_addr=address,
    )


def detect_node(environ: Mapping[str, str] | None = None) -> NodePlacement | None:
    """This node's placement from torchrun's, SLURM's or Coiled's variables (first found).

    Returns None outside any of them, and on a single node (one node needs no placement).

    Raises:
        PlacementError: Variables are present but contradictory or malformed.

    Example:
        >>> env = {"COILED_BATCH_TASK_ID": "1", "COILED_BATCH_TASK_COUNT": "2",
        ...        "COILED_BATCH_SCHEDULER_ADDRESS": "10.0.0.5"}
        >>> detect_node(env).node_rank
        1
    """
    environ = os.environ if environ is None else environ
    for read in (_from_torchrun, _from_slurm, _from_coiled):
        placement = read(environ)
        if placement is not None:
            if placement.node_rank >= placement.num_nodes:
                raise PlacementError(
                    f"The {placement.source} variables put this node at rank "
                    f"{placement.node_rank} of only {placement.num_nodes} nodes."
                )
            return placement if placement.num_nodes > 1 else None
    return None


def slurm_process_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """torch's rank variables for a process that ``srun`` started as one task of the job.

    Empty when torch's variables are already there (torchrun, notebook-kit launch), outside a
    SLURM step, or when the step has a single task. ``MASTER_PORT`` defaults to 29500.

    Example:
        >>> env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
        ...        "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[01-02]"}
        >>> slurm_process_environment(env)["MASTER_ADDR"]
        'gpu01'
    """
    environ = os.environ if environ is None else environ
    # SLURM_STEP_ID marks an srun step; a batch script (or a kernel it started) also sees
    # SLURM_PROCID/SLURM_NTASKS, but there one process alone would wait for a whole world.
    in_step = _first_present(environ, "SLURM_STEP_ID", "SLURM_STEPID") is not None
    if "RANK" in environ or not in_step or "SLURM_PROCID" not in environ:
        return {}
    tasks_name = _first_present(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if tasks_name is None:
        return {}
    tasks = _integer(environ, tasks_name, 1)
    if tasks == 1:
        return {}
    list_name = _first_present(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
    if list_name is None:
        raise PlacementError("SLURM_PROCID is set but no SLURM node list is.")
    return {
        "RANK": str(_integer(environ, "SLURM_PROCID", 0)),
        "WORLD_SIZE": str(tasks),
        "LOCAL_RANK": str(_integer(environ, "SLURM_LOCALID", 0))
        if "SLURM_LOCALID" in environ
        else "0",
        "MASTER_ADDR": environ.get("MASTER_ADDR") or first_host(environ[list_name]),
        "MASTER_PORT": environ.get("MASTER_PORT") or str(DEFAULT_MASTER_PORT),
    }
