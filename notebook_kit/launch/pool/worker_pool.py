"""``WorkerPool``: workers forked once that keep models, data and compiled graphs across cells.

A launch forks fresh workers and loses everything they built when it ends. A pool forks them
once (the launcher's plan, checks, fork and supervisor), forms the process group once, and then
runs functions (:meth:`WorkerPool.run`) and cells (:meth:`WorkerPool.run_cell`, the
``%%distributed`` magic) on them, each in a namespace that stays. The workers live until
:meth:`WorkerPool.close`, the kernel's end, or a fault that leaves them unusable; then the pool
says so and starts new ones at the next run.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal

from notebook_kit.config import arguments
from notebook_kit.config.arguments import takes_arguments_of
from notebook_kit.config.launch_config import LaunchConfig  # noqa: F401 (pool_arguments')
from notebook_kit.config.schema import scoped
from notebook_kit.launch.interrupts import interrupt_latch, interrupt_taken
from notebook_kit.launch.kernel_models import find_kernel_models, load_home_weights
from notebook_kit.launch.launchers.base import prepare_view
from notebook_kit.launch.pool import backend as backends
from notebook_kit.launch.pool.backend import PoolBackend, RunOutcome, WorkersStopped
from notebook_kit.launch.pool.options import pool_arguments, pool_backend, refuse_launch_only
from notebook_kit.launch.pool.post_mortem import PostMortems
from notebook_kit.launch.pool.reloads import ReloadMode, ReloadPolicy, check_reload
from notebook_kit.launch.pool.results import decode_value, raise_for, run_summary
from notebook_kit.launch.pool.shipping import (
    WorkerHoldings,
    code_names,
    hidden_names,
    names_used_by,
    stored_names,
)
from notebook_kit.launch.pool.turns import Turns, one_command_at_a_time
from notebook_kit.launch.pool.view import RunView
from notebook_kit.launch.template_wire import SharedStopFlag
from notebook_kit.live.observer import LaunchInfo
from notebook_kit.runtime.pool_commands import PoolCall, PoolCell, PoolCommand, PoolPull, PoolPush

__all__ = ["WorkerPool"]

_cells = itertools.count(1)


class WorkerPool:
    """Workers that stay: run functions and cells on every rank, keeping what they define.

    Takes the settings of :func:`~notebook_kit.notebook_launcher` (and ``config=``), checked
    before anything is forked. The workers are forked from this kernel when the pool is made
    (their namespace starts as a copy of the kernel's), or from its clean template process when
    it cannot fork safely (empty); kernel definitions are sent along when used, and an object
    the workers already hold is never copied again.

    Args:
        num_processes: Workers (one per GPU when every worker gets one, else on the CPU).
        send_limit: Bytes above which a value a run would copy to every worker is refused
            with a hint to ``push`` it once instead.
        reload: ``"auto"`` reloads your edited modules on every rank before each command,
            ``"off"`` keeps the loaded code, None follows ``%autoreload`` (``pool.reload =``).
        cluster: A cluster, as for ``notebook_launcher`` (a Dask ``Client``, ``"ray"``,
            ...): keep ``num_processes`` ranks warm on each of ``num_nodes`` of its workers
            instead of forking here; every method works there as here, with global ranks
            (docs/cluster.md).
        Others: as for ``notebook_launcher`` (``timeout`` applies to each run). A pool never
            reruns a command and always forks, so ``max_restarts`` above 0 and
            ``isolate=False`` are refused; a ``max_restarts`` from ``config``, the environment
            or the saved default is left to launches.

    Example::

        pool = WorkerPool(num_processes=2)
        pool.run(lambda: torch.distributed.get_rank(), ranks="all")
        # [0, 1]
        pool.push(lr=0.1); pool.run_cell("lr * 10")
        # 1.0
        pool.close()
    """

    @takes_arguments_of(pool_arguments)
    def __init__(self, options: dict[str, Any]) -> None:
        send_limit = arguments.check_int("send_limit", options.pop("send_limit"), minimum=1)
        self._reloads = ReloadPolicy(options.pop("reload"), ship=options["cluster"] is not None)
        refuse_launch_only(**{name: options.pop(name) for name in scoped("launch")})
        self._plan, self._backend = pool_backend(options.pop("cluster"), options, send_limit)
        prepare_view(self._plan.live)  # seconds the first time, whole: not during a run
        main = sys.modules["__main__"].__dict__
        self._holdings = WorkerHoldings(main, hidden_names(), send_limit)
        self._live = backends.LiveProcesses()
        self._generation = 0
        self._stopped_because: str | None = None
        self._turns = Turns()
        self._post_mortems = PostMortems()  # what pool.debug() may open
        self._open()
        with interrupt_latch():
            self._start()

    # -- public API ----------------------------------------------------------------------

    @property
    def num_processes(self) -> int:
        """Ranks of this machine (of each node, with ``cluster=``)."""
        return self._shape.num_processes

    @property
    def world_size(self) -> int:
        """Ranks in all (``num_processes`` on each node, with ``cluster=``)."""
        return self._shape.world_size

    @property
    def pids(self) -> list[int]:
        """Process ids of the running workers (empty while stopped); with ``cluster=``,
        every rank's, node by node."""
        processes = self._live.processes
        return list(processes.pids) if processes is not None else []

    @property
    def where(self) -> str:
        """Where the workers run: "2 processes on this machine ..." or the Dask workers."""
        return self._shape.banner()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`, and after a fault closed a cluster pool's nodes;
        :meth:`restart` (or the default pool's next ``%%distributed`` cell) opens it again."""
        return self._closed

    @one_command_at_a_time
    def ensure_workers(self) -> None:
        """Check the workers before a command: a local pool whose workers ended starts new
        ones; a cluster pool that lost a node since its last command is closed.

        Raises:
            RuntimeError: The pool is closed, or a cluster pool's nodes ended (it is closed
                now; :meth:`restart` starts new nodes).
        """
        self._ensure_running()

    @property
    def reload(self) -> ReloadMode | None:
        """``"auto"``, ``"off"`` or None (as ``%autoreload``): see the class's ``reload``."""
        return self._reloads.mode

    @reload.setter
    def reload(self, mode: ReloadMode | None) -> None:
        self._reloads.mode = check_reload(mode)

    @property
    def restarts(self) -> int:
        """How many times the workers were started again after a fault."""
        return self._generation

    @one_command_at_a_time
    def run(
        self, function: Callable[..., Any], *args: Any, ranks: int | Literal["all"] = 0,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        """Run ``function(*args, **kwargs)`` on every rank; rank 0's value (``ranks="all"``: all).

        The function runs in the workers' namespace; models created in the kernel and given
        to ``Accelerator.prepare`` come back holding rank 0's trained weights, as with
        ``notebook_launcher``.

        Raises:
            WorkerError: A rank raised or died; the message names it and says whether the
                workers kept running.
            SendTooLargeError: An argument or global is too large to copy at every call.

        Example::

            pool.run(train, epochs=3)
            # 0.12
        """
        function = arguments.check_function(function)
        wanted = self._wanted(ranks)
        home = find_kernel_models(function, args, kwargs)
        names = set().union(*(names_used_by(v) for v in (function, *args, *kwargs.values())))
        shipped = self._holdings.needed(names)
        home_file = self._weights_file
        fd = home_file.fd if home and home_file is not None else None
        payload = self._holdings.dumps((shipped, (function, args, kwargs), home), "pool.run")
        what = f"run {getattr(function, '__qualname__', type(function).__name__)}"
        call = self._reloads.attach(PoolCall(payload, fd))  # a refusal sends nothing
        try:
            outcome = self._execute(call, wanted, what, text=False, shipped=shipped)
            answers = outcome.answers
            load_home_weights(home, answers[0].weights, fd)
        finally:
            if home_file is not None:
                home_file.clear()  # the file's memory is the machine's again
        values = [decode_value(answers[r].value, r, for_display=False) for r in wanted]
        return values if ranks == "all" else values[0]

    @one_command_at_a_time
    def run_cell(
        self, source: str, ranks: Sequence[int] | None = None, *, every: bool = False,
        interleave: bool = False, reload: ReloadMode | None = None,
    ) -> Any:  # fmt: skip
        """Run ``source`` as a cell on every rank; the value of rank 0's last expression.

        What the cell defines stays on the workers for the next cell. A trailing ``;``
        hides the value, as in a notebook. Worker output is printed grouped by rank.

        Args:
            ranks: Run it on these ranks only; the others run nothing and keep their state
                (a collective of all ranks in it would wait for them forever). The value is
                the lowest one's.
            every: Return the value of every rank it ran on, as ``{rank: value}`` (a value
                that cannot be rebuilt here is shown by its text).
            interleave: Print the workers' lines as they arrive, each after its rank.
            reload: ``"auto"``/``"off"`` for this cell instead of the pool's ``reload``.

        Example::

            pool.run_cell("import torch.distributed as dist\\nrank = dist.get_rank()")
            pool.run_cell("rank")
            # 0
        """
        if not isinstance(source, str):
            raise TypeError(f"source must be a str of Python code, got {type(source).__name__}.")
        on = self._wanted("all") if ranks is None else sorted({self._wanted(r)[0] for r in ranks})
        if not on:
            raise ValueError("ranks is empty: name the ranks to run on, or None for all.")
        filename = f"<distributed cell {next(_cells)}>"
        code = compile(source, filename, "exec")  # a syntax error shows here, nothing is sent
        shipped = self._holdings.needed(code_names(code))
        cell = PoolCell(source, filename, self._holdings.dumps(shipped, "This cell"))
        cell = self._reloads.attach(cell, reload)  # (before the turn: a refusal sends nothing)
        whole = len(set(on)) == self.world_size  # what only some ranks got is sent again
        try:
            outcome = self._execute(
                cell, on if every else on[:1], "cell", text=True, on=on,
                shipped=shipped if whole else None, interleave=interleave,
            )  # fmt: skip
        finally:
            self._holdings.mark_owned(stored_names(code))
        values = {r: decode_value(outcome.answers[r].value, r, for_display=True) for r in on}
        if every:
            return values
        return None if source.rstrip().endswith(";") else values[on[0]]

    @one_command_at_a_time
    def push(self, **values: Any) -> None:
        """Define ``name=value`` on every worker (sent once; tensors keep their device).

        Example::

            pool.push(data=torch.randn(10_000, 512), lr=0.1)
        """
        for name in values:
            if not name.isidentifier():
                raise ValueError(f"push names must be Python identifiers, got {name!r}.")
        if values:
            payload = self._holdings.dumps(values, "pool.push", limit=False, by_name=False)
            push = self._reloads.attach(PoolPush(payload))
            self._execute(push, [], "push", text=True, record=False)
            for name, value in values.items():
                self._holdings.remember(name, value)

    @one_command_at_a_time
    def pull(self, name: str, rank: int = 0) -> Any:
        """The value of ``name`` on ``rank``; tensors arrive on the CPU.

        Example::

            model = pool.pull("model")
        """
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name must be a Python identifier, got {name!r}.")
        rank = arguments.check_int("rank", rank, minimum=0, maximum=self.world_size - 1)
        outcome = self._execute(PoolPull(name), [rank], f"pull {name}", text=True, record=False)
        return decode_value(outcome.answers[rank].value, rank, for_display=False)

    @one_command_at_a_time
    def debug(self, rank: int | None = None) -> None:
        """pdb in the frame where the last failed command raised, on ``rank`` (default: the
        root-cause rank), asked in the cell; ``q`` leaves it, the workers keep everything.
        Refused before anything is sent when no command failed, ``rank`` did not fail, or the
        workers were stopped or restarted since. Example: ``pool.debug(rank=1)``."""
        self._post_mortems.open(rank, self.world_size, self.pids, self._execute)

    @one_command_at_a_time
    def restart(self) -> None:
        """Stop the workers and start new ones (everything defined on them is lost).

        A closed pool starts new workers too: one closed by :meth:`close`, or a cluster pool
        whose nodes a fault closed (a rank that died, a lost node, code an interrupt could
        not reach).

        Raises:
            ForkSafetyError: The kernel can no longer fork (a CUDA context or a process group
                appeared in it); the workers running now are kept.
        """
        self._check_process()
        self._backend.check_start(self._plan)  # before stopping: a refusal must not cost them
        self._stop("restart() was called")
        if self._closed:
            self._open()
        self._generation += 1
        self._start()

    @one_command_at_a_time
    def close(self) -> None:
        """Let the workers leave the process group and exit. Safe to call twice."""
        self._close_now()

    def _close_now(self) -> None:
        if self._closed or os.getpid() != self._live.pid:
            return
        self._closed = True
        processes, self._live.processes = self._live.processes, None
        if processes is not None:
            processes.close()
        self._finalizer.detach()
        self._stop_flag.close()
        if self._weights_file is not None:
            self._weights_file.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self.pids else "stopped"
        return f"<WorkerPool {self.where}, {state}, pids {self.pids}>"

    # -- running -------------------------------------------------------------------------

    def _wanted(self, ranks: Any) -> list[int]:
        if ranks == "all":
            return list(range(self.world_size))
        return [arguments.check_int("ranks", ranks, minimum=0, maximum=self.world_size - 1)]

    def _execute(
        self, command: PoolCommand, wanted: list[int], what: str, *, text: bool,
        shipped: dict[str, Any] | None = None, record: bool = True,
        on: list[int] | None = None, interleave: bool = False,
    ) -> RunOutcome:  # fmt: skip
        """Run one command on ``on`` (every rank), show it, and raise what went wrong
        (workers stopped if needed); ``wanted``: the ranks whose value comes back."""
        processes = self._ensure_running()
        ranks = on or (
            wanted if isinstance(command, PoolPull) else list(range(processes.world_size))
        )
        live = self._plan.live if record else False
        view = RunView(live, text=text, record=record, interleave=interleave)
        view.on_start(self._info(what, processes))
        for line in processes.take_held_output():
            view.on_output(line.rank, line.stream, line.text)
        self._stop_flag.clear()
        processes.attach(view)
        started = time.monotonic()
        outcome, error = RunOutcome(), None
        try:
            outcome = processes.execute(command, ranks, wanted, self._plan.timeout)
        except BaseException as raised:  # WorkersStopped, or Ctrl-C outside the wait: stop them
            error = raised
            if isinstance(raised, KeyboardInterrupt):
                interrupt_taken()  # the command ends for it: more presses only repeat it
            if isinstance(raised, WorkersStopped):
                outcome = raised.outcome or outcome
            self._stop(raised.reason if isinstance(raised, WorkersStopped) else "interrupted")
        finally:
            processes.attach(None)
            codes = processes.exit_codes()
            stopped = self._stop_flag.is_set()
            view.on_finish(run_summary(outcome, error, codes, started, stopped))
        for name, value in (shipped or {}).items():
            self._holdings.remember(name, value)
        self._post_mortems.note(command, what, outcome, error, processes.pids)
        if error is not None and not processes.restarts_after_fault:
            self._close_now()  # (a cluster's nodes, chosen among the workers of that moment)
        raise_for(outcome, error, self._plan.timeout, processes)
        return outcome

    def _info(self, what: str, processes: PoolBackend) -> LaunchInfo:
        return LaunchInfo(
            f"WorkerPool: {what} on {processes.banner()}", processes.num_processes,
            processes.world_size, tuple(range(processes.world_size)), self._stop_flag,
            processes.rank_nodes,
        )  # fmt: skip

    # -- the workers' lifetime -----------------------------------------------------------

    def _check_process(self) -> None:
        if os.getpid() != self._live.pid:
            raise RuntimeError("A WorkerPool can only be used from the process that made it.")

    def _check_usable(self) -> None:
        self._check_process()
        if self._closed:
            raise RuntimeError(
                "This WorkerPool is closed; pool.restart() starts new workers for it."
            )

    def _open(self) -> None:
        """What the workers share with the kernel, and the finalizer that ends them: made
        anew for each opening (:meth:`_close_now` releases them)."""
        self._closed = False
        self._stop_flag = SharedStopFlag()  # a memory file: the template's workers map it too
        self._finalizer = weakref.finalize(self, backends.stop_at_exit, self._live)
        self._weights_file = self._backend.weights_file()

    def _ensure_running(self) -> PoolBackend:
        self._check_usable()
        processes = self._live.processes
        lost = processes.lost_rank() if processes is not None else None
        if processes is not None and lost is not None:
            self._stop(lost)
            if not processes.restarts_after_fault:
                self._close_now()
                words = processes.stopped_words
                raise RuntimeError(f"The pool's workers were stopped: {lost}. {words}")
        if self._live.processes is None:
            self._generation += 1
            reason = (self._stopped_because or "").split(" (")[0]
            print(
                f"Starting {self.num_processes} new workers for the pool (the previous ones were "
                f"stopped: {reason}); they start from this kernel's namespace as it is now.",
                flush=True,
            )
            self._backend.check_start(self._plan)
            self._start()
        assert self._live.processes is not None
        return self._live.processes

    def _start(self) -> None:
        self._live.processes = self._backend.start(
            self._plan, self._stop_flag, self._generation, self._holdings, self._weights_file
        )
        self._shape = self._live.processes
        self._stopped_because = None

    def _stop(self, reason: str) -> None:
        processes, self._live.processes = self._live.processes, None
        self._stopped_because = reason
        if processes is not None:
            processes.kill()
