"""The ``%%distributed`` cell magic: a notebook cell that runs on every worker of a pool.

Load it with ``%load_ext notebook_kit``. A cell that starts with ``%%distributed`` runs on each
rank of a :class:`~notebook_kit.launch.pool.WorkerPool`, in that worker's own namespace: names
it defines are there in the next ``%%distributed`` cell, rank 0's last expression is the cell's
value, and what the workers print appears grouped by rank. The first such cell starts a default
pool (and says so); ``-n`` picks its size, ``--cluster NAME`` puts it on the machines of the
Dask client (or cluster) of that name in the notebook, ``--pool NAME`` uses a pool of your own
instead. A default pool that was closed (a fault closes a cluster pool's nodes, and so does a
node lost between cells) starts new workers at its next cell, in the same place and of the same
size.

A cell's options (:mod:`~notebook_kit.launch.magic_options`) follow ipyparallel's ``%%px``:
``--ranks 1,2`` or ``--ranks 0:4:2`` runs it on those ranks only (the others run nothing and
keep their state), ``--noblock`` returns at once with a handle
(:class:`~notebook_kit.launch.magic_result.DistributedResult`; ``%distributed wait`` waits for
the last one), ``--local`` runs it in the kernel too, after the ranks, ``--out NAME`` puts
every rank's value in the kernel as ``NAME = {rank: value}``, and ``--interleave`` prints the
workers' lines as they arrive, each after its rank, instead of rank by rank
(``--group-outputs``, the default), and ``--pdb`` opens pdb in the failing rank's frame, in
the cell, when the cell fails (``pool.debug()`` at once). Edited modules of the user's own are
reloaded on the ranks before each cell (the pool's ``reload``, as ``%autoreload`` by default);
``--reload off`` runs a cell on the code the workers hold, and ``%distributed --reload off``
(or ``auto``) sets it for the default pool, or ``--pool NAME``'s, from then on.

Example:
    %load_ext notebook_kit

    %%distributed -n 2
    import torch.distributed as dist
    rank = dist.get_rank()
    print("hello from", rank)

    %%distributed --ranks 1 --out seen
    rank * 10                 # runs on rank 1 only; the kernel gets seen == {1: 10}

    %distributed close        # ends the default pool (the kernel's end does too)

    %distributed --cluster client --num-nodes 2   # the default pool on 2 Dask workers
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from notebook_kit.config.launch_config import resolve_launch_config
from notebook_kit.errors import WorkerError
from notebook_kit.launch.interrupts import interrupt_latch
from notebook_kit.launch.launcher import resolve_plan
from notebook_kit.launch.magic_options import (
    CellOptions,
    out_name,
    parse_ranks,
    refuse_cell_options,
    reload_word,
    usage_error,
)
from notebook_kit.launch.magic_result import DistributedResult, start_in_background
from notebook_kit.launch.pool.worker_pool import WorkerPool

__all__ = ["DistributedMagics", "load_ipython_extension"]


@magics_class
class DistributedMagics(Magics):
    """``%%distributed`` and ``%distributed``; holds this kernel's default pool."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.default_pool: WorkerPool | None = None
        # its Dask client's name in the notebook and its --num-nodes, when on a cluster
        self.default_place: tuple[str | None, int | None] = (None, None)
        self.last_noblock: tuple[WorkerPool, DistributedResult] | None = None
        self.reload: Any = None  # %distributed --reload: the default pool's, kept for new ones
        self._cells = itertools.count(1)

    @magic_arguments()
    @argument("-n", "--num-processes", type=int, default=None, help="workers of the default pool")
    @argument("--pool", default=None, help="name of a WorkerPool in the notebook to run on")
    @argument(
        "--cluster", default=None, help="name of a Dask client or cluster for the default pool"
    )
    @argument("--num-nodes", type=int, default=None, help="with --cluster: Dask workers to use")
    @argument("--ranks", type=parse_ranks, default=None, help="run on these ranks: 1,2 or 0:4:2")
    @argument("--noblock", action="store_true", help="return at once with a handle (`_`)")
    @argument("--local", action="store_true", help="also run the cell here, after the ranks")
    @argument("--out", type=out_name, default=None, help="set NAME = {rank: value} here")
    @argument("--group-outputs", action="store_true", help="print lines rank by rank (default)")
    @argument("--interleave", action="store_true", help="print lines as they come, with rank")
    @argument("--pdb", action="store_true", help="on a failure, pdb in the failing rank's frame")
    @argument("--reload", type=reload_word, default=None, help="reload edited modules: auto|off")
    @argument("action", nargs="?", default=None, help="line form: 'close', 'restart' or 'wait'")
    @line_cell_magic
    def distributed(self, line: str, cell: str | None = None) -> Any:
        """Run the cell on every worker of a pool; without a cell, manage the default pool.

        ``%distributed`` shows the pool, ``%distributed -n 4`` (re)starts the default pool
        with 4 workers, ``%distributed close``/``restart`` ends or restarts it,
        ``%distributed wait`` waits for the last ``--noblock`` cell (and raises its error;
        Ctrl-C there interrupts that cell).
        """
        try:
            options = parse_argstring(self.distributed, line)
        except UsageError as error:
            raise usage_error(error) from None
        if cell is None:
            refuse_cell_options(options)
            return self._line(options)
        if options.action is not None:
            raise UsageError(
                f"%%distributed takes options only, got {options.action!r}; "
                "put the code on the lines below it."
            )
        chosen = CellOptions.from_arguments(options)
        known = self._known_size(options)
        if chosen.ranks is not None and known is not None:
            chosen.ranks.resolve(known)  # before a pool starts for a cell that cannot run
        if not chosen.noblock:
            self._say_if_waiting(options)
        try:
            with interrupt_latch():  # starting the pool and the cell: Ctrl-C raises once
                return self._cell(self._pool(options, chosen.noblock), cell, chosen)
        except WorkerError as error:  # its message holds the worker's traceback: enough
            raise error.with_traceback(None) from None
        except KeyboardInterrupt:  # the pool has said what became of the workers
            raise KeyboardInterrupt from None

    def _cell(self, pool: WorkerPool, cell: str, chosen: CellOptions) -> Any:
        """Run the cell as its options say: on which ranks, waiting or not, and after it."""
        ranks = None if chosen.ranks is None else chosen.ranks.resolve(pool.world_size)
        every = chosen.out is not None or chosen.noblock
        compile(cell, "<distributed cell>", "exec")  # a syntax error shows here, nothing runs

        def run() -> Any:
            return pool.run_cell(
                cell, ranks, every=every, interleave=chosen.interleave, reload=chosen.reload
            )

        def keep(values: dict[int, Any]) -> None:
            if chosen.out is not None:
                self.shell.user_ns[chosen.out] = values

        if chosen.noblock:
            count = getattr(self.shell, "execution_count", None)  # the cell's In [N]
            handle = DistributedResult(f"In [{count or next(self._cells)}]", ranks)
            start_in_background(handle, run, keep)
            self.last_noblock = (pool, handle)
            return handle
        try:
            value = run()
        except WorkerError:
            if chosen.pdb:
                _post_mortem(pool)
            raise
        if every:
            keep(value)
            value = None if cell.rstrip().endswith(";") else value[min(value)]
        if chosen.local:
            run_locally(self.shell, cell)
        return value

    def _known_size(self, options: Any) -> int | None:
        """The world size the cell's pool will have, when it is known without starting it."""
        if options.pool is not None:
            named = self.shell.user_ns.get(options.pool)
            return named.world_size if isinstance(named, WorkerPool) else None
        if options.cluster is not None:
            return None  # the nodes decide; checked once they have
        if options.num_processes is not None:
            return int(options.num_processes)
        pool = self.default_pool
        return pool.world_size if pool is not None and self.default_place[0] is None else None

    def _say_if_waiting(self, options: Any) -> None:
        """A cell behind a --noblock one on the same pool says why it does not start yet."""
        named = self.shell.user_ns.get(options.pool) if options.pool else self.default_pool
        if named is not None and self._busy(named):
            assert self.last_noblock is not None
            label = self.last_noblock[1].label
            print(f"Waiting for the --noblock cell {label} to end...", flush=True)

    def _wait(self) -> Any:
        """``%distributed wait``: the last --noblock cell's value, once it ended."""
        if self.last_noblock is None:
            return None
        handle = self.last_noblock[1]
        with interrupt_latch():  # Ctrl-C here interrupts the cell, once, however often pressed
            try:
                handle.wait()
            except KeyboardInterrupt:
                handle.interrupt()
                handle.wait()  # its ranks settle as a blocking cell's do: bounded
            return handle.result()

    def _line(self, options: Any) -> Any:
        if options.action == "close":
            if self.default_pool is not None:
                self.default_pool.close()
                self.default_pool, self.default_place = None, (None, None)
            return None
        if options.action == "restart":
            pool, started = self._choose(options)
            if not started:
                pool.restart()
            return None
        if options.action == "wait":
            return self._wait()
        if options.action is not None:
            raise UsageError(
                f"%distributed knows 'close', 'restart' and 'wait', got {options.action!r}."
            )
        if options.reload is not None:
            return self._set_reload(options)
        return self._pool(options)

    def _set_reload(self, options: Any) -> None:
        """``%distributed --reload auto|off``: the pool's reload from now on (a default pool
        not started yet gets it when it starts)."""
        if options.pool is not None:
            self._pool(options).reload = options.reload
            return
        self.reload = options.reload
        if self.default_pool is not None:
            self.default_pool.reload = options.reload

    def _pool(self, options: Any, noblock: bool = False) -> WorkerPool:
        return self._choose(options, noblock)[0]

    def _choose(self, options: Any, noblock: bool = False) -> tuple[WorkerPool, bool]:
        """The pool the options name, and whether its workers were started just now."""
        if options.pool is not None:
            pool = self.shell.user_ns.get(options.pool)
            if not isinstance(pool, WorkerPool):
                raise NameError(
                    f"--pool {options.pool}: no WorkerPool of that name in the notebook; "
                    f"create one first: {options.pool} = WorkerPool(num_processes=2)."
                )
            return pool, False
        wanted, place = options.num_processes, (options.cluster, options.num_nodes)
        if options.num_nodes is not None and options.cluster is None:
            raise ValueError(
                "--num-nodes needs --cluster NAME: without a cluster the default pool runs on "
                "this machine only."
            )
        pool = self.default_pool
        # --cluster NAME without --num-nodes keeps the nodes the pool has, as no -n keeps its size
        named, nodes = self.default_place
        same_place = options.cluster is None or (
            options.cluster == named and options.num_nodes in (None, nodes)
        )
        if pool is not None and same_place and wanted in (None, pool.num_processes):
            if not pool.closed and not (noblock and self._busy(pool)):
                with contextlib.suppress(RuntimeError):  # it closes if a node was lost
                    pool.ensure_workers()
            if not pool.closed:
                return pool, False
            print(
                "Starting new workers for the default pool, which was closed (what earlier "
                "cells defined on its workers is lost).",
                flush=True,
            )
            pool.restart()  # the same place and size: a cluster pool chooses its nodes again
            return pool, True
        client = self._cluster(options.cluster) if options.cluster is not None else None
        if pool is not None:
            if not pool.closed:
                print(f"Closed the default pool of {pool.num_processes} workers.")
            pool.close()
            self.default_pool = None
        if client is not None:
            pool = WorkerPool(
                num_processes=wanted, num_nodes=options.num_nodes, cluster=client,
                reload=self.reload,
            )  # fmt: skip
        else:
            pool = WorkerPool(num_processes=wanted or _default_size(), reload=self.reload)
        self.default_pool, self.default_place = pool, place
        where = pool.where
        more = " (`-n 2` for two ranks)" if pool.world_size == 1 else ""
        print(
            f"Started a pool for %%distributed cells: {where}{more}. What the cells define "
            "stays on the workers until the kernel ends (`%distributed close` ends it sooner; "
            "`%%distributed -n N` changes its size).",
            flush=True,
        )
        return pool, True

    def _busy(self, pool: WorkerPool) -> bool:
        """A --noblock cell is still running on ``pool``: a check would wait for it, so a
        second --noblock cell leaves the check to its own turn."""
        return (
            self.last_noblock is not None
            and self.last_noblock[0] is pool
            and not (self.last_noblock[1].done())
        )

    def _cluster(self, name: str) -> Any:
        """The Dask client (or cluster) named ``name`` in the notebook."""
        client = self.shell.user_ns.get(name)
        if client is None or not (hasattr(client, "scheduler") or hasattr(client, "get_client")):
            raise NameError(
                f"--cluster {name}: no Dask client or cluster of that name in the notebook; "
                f"create one first: {name} = distributed.Client(scheduler_address)."
            )
        return client


def _default_size() -> int | None:
    """Two workers on a machine without a GPU, unless a saved config says how many.

    The launcher's default (one per GPU, else one) would give a CPU machine a pool of one
    rank, where nothing is distributed. None leaves the launcher's default.
    """
    if resolve_launch_config().num_processes is not None:
        return None
    plan = resolve_plan({}, "%%distributed")
    return 2 if plan.device == "cpu" and plan.num_processes == 1 else None


def _post_mortem(pool: WorkerPool) -> None:
    """``--pdb``: pdb where the cell failed, before its error is shown; or why it cannot be."""
    try:
        pool.debug()
    except (RuntimeError, ValueError) as refused:  # the workers were stopped as it failed
        print(f"--pdb: {refused}", flush=True)


class LocalRunFailed(Exception):
    """``--local``: the kernel's run of the cell raised; its traceback is shown above."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"{type(self).__name__}: {self}"]


def run_locally(shell: Any, cell: str) -> None:
    """``--local``: run the cell in the kernel as IPython runs a cell, without showing its
    value (the cell's value is the ranks'); an error shows its traceback and ends the cell."""
    outcome = shell.run_cell(cell, silent=True)
    if not outcome.success:
        raise LocalRunFailed(
            "--local: the cell ran on the ranks, then failed in the kernel (above)."
        )


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext notebook_kit``: register the ``distributed`` magics with this shell."""
    ipython.register_magics(DistributedMagics(ipython))
