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
from collections.abc import Callable
from typing import Any, Literal

from notebook_kit.config import arguments
from notebook_kit.config.launch_config import LaunchConfig
from notebook_kit.config.launch_plan import DEFAULT_RENDEZVOUS_TIMEOUT, LaunchPlan
from notebook_kit.launch.homecoming import find_kernel_models, load_home_weights
from notebook_kit.launch.launcher import resolve_plan
from notebook_kit.launch.pool_results import (
    STILL_RUNNING,
    PoolRunError,
    decode_value,
    failures_of,
    run_summary,
)
from notebook_kit.launch.pool_shipping import (
    DEFAULT_SEND_LIMIT,
    Shipping,
    code_names,
    hidden_names,
    names_used_by,
    stored_names,
)
from notebook_kit.launch.pool_view import RunView, prepare_live_view
from notebook_kit.launch.pool_workers import Ending, PoolProcesses, RunOutcome
from notebook_kit.launch.preflight import check_fork_safety
from notebook_kit.live.observer import LaunchInfo
from notebook_kit.runtime.context import StopFlag

__all__ = ["WorkerPool"]

_cells = itertools.count(1)


class _Holder:
    """What the finalizer needs, without the pool itself: the live processes."""

    def __init__(self) -> None:
        self.processes: PoolProcesses | None = None
        self.pid = os.getpid()


def _stop_at_exit(holder: _Holder) -> None:
    """The pool was collected or the kernel is exiting: stop its workers (in the kernel only)."""
    if os.getpid() == holder.pid and holder.processes is not None:
        holder.processes.kill()
        holder.processes = None


class WorkerPool:
    """Workers that stay: run functions and cells on every rank, keeping what they define.

    Takes the settings of :func:`~notebook_kit.notebook_launcher` (and ``config=``), checked
    before anything is forked. The workers are forked from this kernel when the pool is made,
    so their namespace starts as a copy of the kernel's; functions and classes defined in
    kernel cells later are sent along when used, and an object the workers already hold is
    never copied again.

    Args:
        num_processes: Workers (one per GPU when every worker gets one, else on the CPU).
        send_limit: Bytes above which a value a run would copy to every worker is refused
            with a hint to ``push`` it once instead.
        Others: as for ``notebook_launcher`` (``timeout`` applies to each run;
            ``max_restarts`` and ``isolate`` are accepted but a pool never retries a run).

    Example:
        >>> pool = WorkerPool(num_processes=2)
        >>> pool.run(lambda: torch.distributed.get_rank(), ranks="all")
        [0, 1]
        >>> pool.push(lr=0.1); pool.run_cell("lr * 10")
        1.0
        >>> pool.close()
    """

    def __init__(
        self,
        num_processes: int | None = None,
        *,
        mixed_precision: arguments.MixedPrecision | None = None,
        use_port: int | None = None,
        master_addr: str | None = None,
        node_rank: int | None = None,
        num_nodes: int | None = None,
        backend: arguments.Backend | None = None,
        threads_per_process: int | None = None,
        timeout: float | None = None,
        gradient_accumulation_steps: int | None = None,
        rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT,
        max_restarts: int | None = None,
        seed: int | None = None,
        live: bool | None = None,
        isolate: bool = True,
        config: LaunchConfig | None = None,
        send_limit: int = DEFAULT_SEND_LIMIT,
    ) -> None:
        options = {k: v for k, v in locals().items() if k not in ("self", "send_limit")}
        self.plan: LaunchPlan = resolve_plan(options, "WorkerPool", isolate=True)
        if self.plan.num_nodes != 1:
            raise ValueError(
                f"num_nodes={self.plan.num_nodes}: a WorkerPool runs on this node only. Use "
                "notebook_launcher (or `notebook-kit launch`) for a job across nodes."
            )
        send_limit = arguments.check_int("send_limit", send_limit, minimum=1)
        check_fork_safety(self.plan.kernel)
        prepare_live_view(self.plan.live)
        main = sys.modules["__main__"].__dict__
        self._shipping = Shipping(main, hidden_names(), send_limit)
        self._stop_flag = StopFlag()
        self._holder = _Holder()
        self._generation = 0
        self._stopped_because: str | None = None
        self._closed = False
        self._finalizer = weakref.finalize(self, _stop_at_exit, self._holder)
        self._start()

    # -- public API ----------------------------------------------------------------------

    @property
    def num_processes(self) -> int:
        return self.plan.num_processes

    @property
    def pids(self) -> list[int]:
        """Process ids of the running workers (empty while stopped)."""
        processes = self._holder.processes
        return list(processes.pids) if processes is not None else []

    @property
    def restarts(self) -> int:
        """How many times the workers were started again after a fault."""
        return self._generation

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

        Example:
            >>> pool.run(train, epochs=3)
            0.12
        """
        function = arguments.check_function(function)
        wanted = self._wanted(ranks)
        home = find_kernel_models(function, args, kwargs)
        names = set().union(*(names_used_by(v) for v in (function, *args, *kwargs.values())))
        shipped = self._shipping.needed(names)
        request = {"shipped": shipped, "call": (function, args, kwargs), "home": home}
        body = self._shipping.dumps(request, "pool.run")
        what = f"run {getattr(function, '__qualname__', type(function).__name__)}"
        outcome = self._execute("call", body, wanted, what, text=False, shipped=shipped)
        answers = outcome.answers
        load_home_weights(home, answers[0]["payload"]["weights"])
        values = [decode_value(answers[r]["payload"], r, for_display=False) for r in wanted]
        return values if ranks == "all" else values[0]

    def run_cell(self, source: str) -> Any:
        """Run ``source`` as a cell on every rank; the value of rank 0's last expression.

        What the cell defines stays on the workers for the next cell. A trailing ``;``
        hides the value, as in a notebook. Worker output is printed grouped by rank.

        Example:
            >>> pool.run_cell("import torch.distributed as dist\\nrank = dist.get_rank()")
            >>> pool.run_cell("rank")
            0
        """
        if not isinstance(source, str):
            raise TypeError(f"source must be a str of Python code, got {type(source).__name__}.")
        filename = f"<distributed cell {next(_cells)}>"
        code = compile(source, filename, "exec")  # a syntax error shows here, nothing is sent
        shipped = self._shipping.needed(code_names(code))
        request = {"shipped": shipped, "source": source, "filename": filename}
        body = self._shipping.dumps(request, "This cell")
        try:
            outcome = self._execute("cell", body, [0], "cell", text=True, shipped=shipped)
        finally:
            self._shipping.mark_owned(stored_names(code))
        value = decode_value(outcome.answers[0]["payload"], 0, for_display=True)
        return None if source.rstrip().endswith(";") else value

    def push(self, **values: Any) -> None:
        """Define ``name=value`` on every worker (sent once; tensors keep their device).

        Example:
            >>> pool.push(data=torch.randn(10_000, 512), lr=0.1)
        """
        for name in values:
            if not name.isidentifier():
                raise ValueError(f"push names must be Python identifiers, got {name!r}.")
        if values:
            request = {"values": values}
            body = self._shipping.dumps(request, "pool.push", limit=False, by_name=False)
            self._execute("push", body, [], "push", text=True, record=False)
            for name, value in values.items():
                self._shipping.remember(name, value)

    def pull(self, name: str, rank: int = 0) -> Any:
        """The value of ``name`` on ``rank``; tensors arrive on the CPU.

        Example:
            >>> model = pool.pull("model")
        """
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name must be a Python identifier, got {name!r}.")
        rank = arguments.check_int("rank", rank, minimum=0, maximum=self.num_processes - 1)
        body = self._shipping.dumps({"name": name}, "pool.pull")
        outcome = self._execute("pull", body, [rank], f"pull {name}", text=True, record=False)
        return decode_value(outcome.answers[rank]["payload"], rank, for_display=False)

    def restart(self) -> None:
        """Stop the workers and start new ones (everything defined on them is lost)."""
        self._check_usable()
        self._stop("restart() was called")
        self._generation += 1
        self._start()

    def close(self) -> None:
        """Let the workers leave the process group and exit. Safe to call twice."""
        if self._closed or os.getpid() != self._holder.pid:
            return
        self._closed = True
        processes, self._holder.processes = self._holder.processes, None
        if processes is not None:
            processes.close()
        self._finalizer.detach()
        self._stop_flag.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self.pids else "stopped"
        return f"<WorkerPool {self.num_processes} processes, {state}, pids {self.pids}>"

    # -- running -------------------------------------------------------------------------

    def _wanted(self, ranks: Any) -> list[int]:
        if ranks == "all":
            return list(range(self.num_processes))
        return [arguments.check_int("ranks", ranks, minimum=0, maximum=self.num_processes - 1)]

    def _execute(
        self,
        kind: str,
        body: bytes,
        wanted: list[int],
        what: str,
        *,
        text: bool,
        shipped: dict[str, Any] | None = None,
        record: bool = True,
    ) -> RunOutcome:
        """Run one command, show it, and raise what went wrong (workers stopped if needed)."""
        processes = self._ensure_running()
        ranks = wanted if kind == "pull" else list(range(self.num_processes))
        view = RunView(self.plan.live if record else False, text=text, record=record)
        view.on_start(self._info(what))
        for line in processes.take_held_output():
            view.on_output(*line)
        self._stop_flag.clear()
        processes.relay.view = view
        started = time.monotonic()
        outcome, error = RunOutcome(), None
        try:
            outcome = processes.execute(kind, body, ranks, wanted, self.plan.timeout)
        except BaseException as raised:  # Ending, or Ctrl-C outside the wait: stop them
            error = raised
            if isinstance(raised, Ending):
                outcome = raised.outcome or outcome
            self._stop(raised.reason if isinstance(raised, Ending) else "interrupted")
        finally:
            processes.relay.view = None
            codes = {w.rank: w.exit_code for w in processes.supervisor.workers}
            stopped = self._stop_flag.is_set()
            view.on_finish(run_summary(outcome, error, codes, started, stopped))
        for name, value in (shipped or {}).items():
            self._shipping.remember(name, value)
        self._raise_for(outcome, error)
        return outcome

    def _raise_for(self, outcome: RunOutcome, error: BaseException | None) -> None:
        lost = "Everything defined on the workers is lost; the next run starts new workers."
        if isinstance(error, Ending):
            if outcome.interrupted:
                print(f"Interrupted; the workers were stopped: {error.reason}. {lost}")
                raise KeyboardInterrupt
            failures = failures_of(outcome.answers) + error.failures
            if not failures:
                raise RuntimeError(f"The pool's workers were stopped: {error.reason}. {lost}")
            raise PoolRunError(
                failures, self.plan.world_size, f"The workers were stopped: {error.reason}. {lost}"
            ) from None
        if error is not None:
            raise error
        if outcome.interrupted:
            print("Interrupted on every rank; the workers keep everything defined on them.")
            raise KeyboardInterrupt
        failures = failures_of(outcome.answers)
        if failures:
            raise PoolRunError(failures, self.plan.world_size, STILL_RUNNING)
        if outcome.timed_out:
            raise TimeoutError(
                f"The run did not finish within timeout={self.plan.timeout} s and was "
                "interrupted on every rank; the workers keep everything defined on them."
            )

    def _info(self, what: str) -> LaunchInfo:
        where = self.plan.banner().removeprefix("Launching ")
        ranks = tuple(range(self.num_processes))
        return LaunchInfo(
            f"WorkerPool: {what} on {where}", self.num_processes, self.plan.world_size, ranks,
            self._stop_flag,
        )  # fmt: skip

    # -- the workers' lifetime -----------------------------------------------------------

    def _check_usable(self) -> None:
        if os.getpid() != self._holder.pid:
            raise RuntimeError("A WorkerPool can only be used from the process that made it.")
        if self._closed:
            raise RuntimeError("This WorkerPool is closed; create a new one.")

    def _ensure_running(self) -> PoolProcesses:
        self._check_usable()
        lost = self._holder.processes.lost_rank() if self._holder.processes else None
        if lost is not None:
            self._stop(lost)
        if self._holder.processes is None:
            self._generation += 1
            reason = (self._stopped_because or "").split(" (")[0]
            print(
                f"Starting {self.num_processes} new workers for the pool (the previous ones were "
                f"stopped: {reason}); they start from this kernel's namespace as it is now.",
                flush=True,
            )
            check_fork_safety()
            self._start()
        assert self._holder.processes is not None
        return self._holder.processes

    def _start(self) -> None:
        self._shipping.remember_all()  # the workers are about to hold all of this
        self._holder.processes = PoolProcesses.start(self.plan, self._stop_flag, self._generation)
        self._stopped_because = None

    def _stop(self, reason: str) -> None:
        processes, self._holder.processes = self._holder.processes, None
        self._stopped_because = reason
        if processes is not None:
            processes.kill()
