"""The messages of a cluster run, between the kernel, each node task and its node process.

The kernel publishes a :class:`Control` (lease, Stop, abort) and sends a pool's
:data:`NodeCommand` and the lines typed at a rank's pdb prompt (:class:`DebuggerAnswer`, on the
same command topic) through its engine; each node task (``notebook_kit.node.task``) relays them
to its node process (``notebook_kit.launch.node_process.process``) on the orders pipe, and the
node's :data:`NodeEvent` and, last, its :data:`NodeOutcome` back to the kernel in batches.

Every message is a frozen dataclass of this module, sealed plain data through the one codec
(:mod:`notebook_kit.runtime.codec`). Every party runs the same notebook_kit (the pre-flight
probe checks the versions). Names on the engine's shared state (event topic, variables) all
derive from the run's random id, so two runs, or two kernels sharing a cluster, never read
each other's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from notebook_kit.config.launch_config import LaunchConfig
from notebook_kit.errors import WorkerFailure
from notebook_kit.runtime import codec, pool_commands
from notebook_kit.runtime.codec import ProtocolError, Seal
from notebook_kit.runtime.messages import (
    DebuggerLeft,
    DebuggerLine,
    DebuggerPrompt,
    Failure,
    MetricsBatch,
    OutputLine,
    PoolAnswer,
    ProfileDone,
    Progress,
    RankSpeed,
)
from notebook_kit.runtime.pool_commands import PoolCommand

__all__ = [
    "ADDRESS",
    "CONTROL_PERIOD_SECONDS",
    "EVENT",
    "LEASE_SECONDS",
    "OUTCOME",
    "URGENT",
    "Control",
    "DebuggerAnswer",
    "Interrupt",
    "LaunchStop",
    "NodeAnswer",
    "NodeCommand",
    "NodeError",
    "NodeEvent",
    "NodeFailed",
    "NodeFinished",
    "NodeInterrupted",
    "NodeOrder",
    "NodeOutcome",
    "NodePrint",
    "NodeProfiles",
    "NodeReady",
    "NodeReport",
    "NodeSettings",
    "NodeStacks",
    "NodeValue",
    "ProbeReport",
    "ProfileAsk",
    "ProtocolError",
    "Rendezvous",
    "RunCommand",
    "RunNames",
    "Seal",
    "StacksAsk",
    "StopCommand",
    "control_frame",
    "decode",
    "encode",
]

# The kernel renews its lease this often; a node that sees no renewal for LEASE_SECONDS
# (the kernel died, or the node's network is gone) ends its node process.
CONTROL_PERIOD_SECONDS = 0.5
LEASE_SECONDS = 15.0

# The first byte of each frame a node process writes to its task: node 0's rendezvous address
# (for the task to publish), an event for the kernel that may wait for the next batch, one the
# kernel waits for (it leaves at once, with every event before it), or the final outcome.
ADDRESS, EVENT, URGENT, OUTCOME = b"A", b"E", b"U", b"O"


T = TypeVar("T")


def encode(message: Any, seal: Seal) -> bytes:
    """A message of this module as one frame: plain data, sealed with the run's secret."""
    return codec.encode(message, _KINDS, seal)


def decode(data: bytes, *kinds: type[T], seal: Seal) -> T:
    """The message ``data`` holds, which must be sealed by ``seal`` and one of ``kinds``.

    Raises:
        ProtocolError: anything else (a forgery, another run's frame, damaged bytes).
    """
    return codec.decode(data, _KINDS, *kinds, seal=seal)


# -- the kernel's control variable ------------------------------------------------------------


@dataclass(frozen=True)
class Control:
    """What the kernel publishes: a lease counter, the Stop request, an abort reason.

    It travels through the codec unsealed (:func:`control_frame`): the scheduler or the Ray hub
    holds plain data, and the hub reads it to tell a lease tick from a change.
    """

    lease: int = 0
    stop: bool = False
    abort: str = ""
    stacks: int = 0  # the latest stacks() request: each node answers a number once
    stacks_seconds: float = 0.0  # how long a node's ranks get to answer it
    profile: ProfileAsk | None = None  # the latest profile() request, answered once


def control_frame(control: Control) -> bytes:
    """The control variable's value (:func:`read_control` reads it back)."""
    return codec.encode(control, _KINDS)


def read_control(data: bytes) -> Control:
    """The :class:`Control` a control variable holds."""
    return codec.decode(data, _KINDS, Control)


# -- kernel to node process (relayed by the node task) ----------------------------------------


@dataclass(frozen=True)
class Rendezvous:
    """Node 0's rendezvous address, for every other node (published, then relayed)."""

    host: str
    port: int


@dataclass(frozen=True)
class LaunchStop:
    """The Stop button of a launch: the node's ranks stop at their next vote."""


@dataclass(frozen=True)
class StacksAsk:
    """``notebook_kit.stacks()``: the node's ranks' stacks, gathered within ``seconds``."""

    number: int
    seconds: float


@dataclass(frozen=True)
class ProfileAsk:
    """``notebook_kit.profile()``: the node's ranks profile their next ``steps`` steps within
    ``seconds``, each writing its trace into ``folder`` on its node (``steps`` 0: stop)."""

    number: int
    steps: int
    seconds: float
    folder: str


@dataclass(frozen=True)
class RunCommand:
    """A pool command for the node's ranks among ``ranks`` (global); ``want``: the global
    ranks whose value comes back. A group check runs on every node at once (its all-reduce
    spans them all); a close ends the node's ranks and its node process."""

    seq: int
    command: PoolCommand
    ranks: tuple[int, ...]
    want: tuple[int, ...]


@dataclass(frozen=True)
class StopCommand:
    """The Stop button during pool command ``seq``."""

    seq: int


@dataclass(frozen=True)
class Interrupt:
    """A rank elsewhere failed, Ctrl-C or a timeout, during pool command ``seq``."""

    seq: int


NodeCommand = RunCommand | StopCommand | Interrupt
NODE_COMMANDS = (RunCommand, StopCommand, Interrupt)


@dataclass(frozen=True)
class DebuggerAnswer:
    """The line typed in the kernel's cell at global ``rank``'s pdb prompt (a launch's or a
    pool's: sent to every node like a pool command; the node holding ``rank`` writes it)."""

    rank: int
    line: DebuggerLine


# -- node process to kernel ----------------------------------------------------------------


@dataclass(frozen=True)
class NodePrint:
    """A line the node's launcher printed (a stall report), as a local launch prints it."""

    text: str


@dataclass(frozen=True)
class NodeReady:
    """A pool's node formed the group: its ranks' pids."""

    node: int
    pids: tuple[int, ...]


@dataclass(frozen=True)
class NodeAnswer:
    """A node's answer to pool order ``seq``: each of its ranks' answers, or why it stopped.

    ``status`` is ``ok``, or ``stopped`` when the node's ranks had to be stopped (``reason``
    and ``failures`` say why), which ends the node.
    """

    node: int
    seq: int
    status: str
    answers: dict[int, PoolAnswer] = field(default_factory=dict)
    reason: str = ""
    failures: tuple[WorkerFailure, ...] = ()


@dataclass(frozen=True)
class NodeFinished:
    """A launch's node ended; ``ranks``: its global ranks; ``failures``: its ranks' (the
    kernel ends the others at once)."""

    node: int
    ranks: tuple[int, ...]
    failures: tuple[WorkerFailure, ...]
    stopped: bool


@dataclass(frozen=True)
class NodeStacks:
    """A node's answer to :class:`StacksAsk` ``number``: each of its ranks' text, by global
    rank, and what the texts leave out (no py-spy on the node), if anything."""

    node: int
    number: int
    texts: dict[int, str]
    note: str = ""


@dataclass(frozen=True)
class NodeProfiles:
    """A node's answer to :class:`ProfileAsk` ``number``: each of its ranks' profile, by
    global rank (an error in one names why it could not), or why none was asked."""

    node: int
    number: int
    done: dict[int, ProfileDone]
    error: str = ""


# A rank's lines, metrics and pdb prompts travel as the runtime's own messages (global ranks).
NodeEvent = (
    OutputLine | MetricsBatch | NodePrint | NodeReady | NodeAnswer | NodeFinished | NodeStacks
    | NodeProfiles | DebuggerPrompt | DebuggerLeft
)  # fmt: skip
NODE_EVENTS = (
    OutputLine, MetricsBatch, NodePrint, NodeReady, NodeAnswer, NodeFinished, NodeStacks,
    NodeProfiles, DebuggerPrompt, DebuggerLeft,
)  # fmt: skip
# Events the kernel waits for: the task sends them on at once, with every event before them.
URGENT_EVENTS = (
    NodeReady, NodeAnswer, NodeFinished, NodeStacks, NodeProfiles, DebuggerPrompt, DebuggerLeft,
)  # fmt: skip


@dataclass(frozen=True)
class NodeValue:
    """The node ended well; global rank 0's value and weights (other nodes: None, {})."""

    value: Any = None
    weights: dict[int, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeFailed:
    """The node's ranks failed."""

    failures: tuple[WorkerFailure, ...]


@dataclass(frozen=True)
class NodeError:
    """The node process itself failed before or around its ranks."""

    exception_type: str
    message: str
    traceback: str


@dataclass(frozen=True)
class NodeInterrupted:
    """The node process was interrupted (the kernel's abort, or its lease ran out)."""


NodeOutcome = NodeValue | NodeFailed | NodeError | NodeInterrupted
NODE_OUTCOMES = (NodeValue, NodeFailed, NodeError, NodeInterrupted)


@dataclass(frozen=True)
class RunNames:
    """The scheduler-side names of one run (one per kernel-side attempt)."""

    run_id: str

    @property
    def events(self) -> str:
        return f"notebook_kit-{self.run_id}-events"

    @property
    def control(self) -> str:
        return f"notebook_kit-{self.run_id}-control"

    @property
    def address(self) -> str:
        return f"notebook_kit-{self.run_id}-address"

    @property
    def commands(self) -> str:
        """A pool's commands to every node (a topic: none is lost, each arrives in order)."""
        return f"notebook_kit-{self.run_id}-commands"

    def started(self, node_rank: int) -> str:
        return f"notebook_kit-{self.run_id}-started-{node_rank}"

    def all_variables(self, num_nodes: int) -> list[str]:
        return [self.control, self.address, *(self.started(n) for n in range(num_nodes))]


@dataclass(frozen=True)
class ProbeReport:
    """What a Dask worker said about itself before the run (``notebook_kit.node.probe``)."""

    worker: str
    host: str
    hostname: str
    python: str
    torch: str
    notebook_kit: str
    gpus: int
    interface: str | None  # the interface whose address reaches node 0
    local_address: str | None  # this worker's address on that interface
    rebuild_error: str | None  # why the function could not be unpickled there, if it failed


@dataclass(frozen=True)
class NodeSettings:
    """What every node's launcher is given, resolved in the kernel before anything starts.

    ``config`` holds the run's settings as one node (what the kernel keeps, ``num_nodes``,
    ``max_restarts`` and ``live``, at their defaults: each node gets its own place and the
    kernel restarts and shows every node); ``num_processes`` None until node 0's probe.
    """

    config: LaunchConfig
    rendezvous_timeout: float
    stall_seconds: float | None
    post_mortem: bool = False  # a rank that raises opens pdb in its frame, asked in the cell
    collective_timeout: float | None = None  # the kernel's: its cell answers the ranks' pdb

    @property
    def num_processes(self) -> int:
        """Ranks on each node (known once node 0's probe has counted its GPUs)."""
        assert self.config.num_processes is not None, "set from node 0's probe first"
        return self.config.num_processes

    def with_processes(self, gpus: int) -> NodeSettings:
        """``num_processes`` decided as on one machine: one per GPU of node 0, else one."""
        if self.config.num_processes is not None:
            return self
        return replace(self, config=self.config.replace(num_processes=max(gpus, 1)))


@dataclass(frozen=True)
class NodeOrder:
    """Everything one node needs; it travels inside the Dask task, not the environment.

    ``payload`` is the cloudpickled ``((function, args, kwargs), models)``; ``settings`` are
    what every node's launcher shares.
    """

    run_id: str
    node_rank: int
    num_nodes: int
    host: str
    interface: str | None
    payload: bytes
    settings: NodeSettings
    store_prefix: str
    lease_seconds: float = LEASE_SECONDS
    host_nodes: int = 1  # nodes of this run on this node's host, which share its cores
    pool: bool = False  # keep the ranks and serve the kernel's commands (a cluster pool)
    restart_count: int = 0  # times the kernel started every node again before this attempt


@dataclass(frozen=True)
class NodeReport:
    """What a node task returns: the node process's outcome, or why there is none."""

    node_rank: int
    worker: str
    outcome: bytes | None = None  # the node process's encoded NodeOutcome
    ended_by: str = ""  # "", "lease", "abort", "refused", "died"
    exit_code: int | None = None


# Every dataclass a frame may hold: :func:`decode` rebuilds none but these.
_KINDS = codec.kinds_of(
    *NODE_EVENTS, *NODE_COMMANDS, *NODE_OUTCOMES, LaunchStop, StacksAsk, ProfileAsk, ProfileDone,
    Rendezvous, NodeOrder, Control, DebuggerAnswer, DebuggerLine,
    NodeSettings, WorkerFailure, Failure, PoolAnswer, Progress, RankSpeed,
    *pool_commands.KINDS.values(),
)  # fmt: skip
