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

Example:
    %load_ext notebook_kit

    %%distributed -n 2
    import torch.distributed as dist
    rank = dist.get_rank()
    print("hello from", rank)

    %distributed close        # ends the default pool (the kernel's end does too)

    %distributed --cluster client --num-nodes 2   # the default pool on 2 Dask workers
"""

from __future__ import annotations

import contextlib
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from notebook_kit.config.launch_config import resolve_launch_config
from notebook_kit.errors import WorkerError
from notebook_kit.launch.interrupts import interrupt_latch
from notebook_kit.launch.launcher import resolve_plan
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

    @magic_arguments()
    @argument("-n", "--num-processes", type=int, default=None, help="workers of the default pool")
    @argument("--pool", default=None, help="name of a WorkerPool in the notebook to run on")
    @argument(
        "--cluster", default=None, help="name of a Dask client or cluster for the default pool"
    )
    @argument("--num-nodes", type=int, default=None, help="with --cluster: Dask workers to use")
    @argument("action", nargs="?", default=None, help="line form only: 'close' or 'restart'")
    @line_cell_magic
    def distributed(self, line: str, cell: str | None = None) -> Any:
        """Run the cell on every worker of a pool; without a cell, manage the default pool.

        ``%distributed`` shows the pool, ``%distributed -n 4`` (re)starts the default pool
        with 4 workers, ``%distributed close``/``restart`` ends or restarts it.
        """
        options = parse_argstring(self.distributed, line)
        if cell is None:
            return self._line(options)
        if options.action is not None:
            raise ValueError(
                f"%%distributed takes options only, got {options.action!r}; "
                "put the code on the lines below it."
            )
        try:
            with interrupt_latch():  # starting the pool and the cell: Ctrl-C raises once
                return self._pool(options).run_cell(cell)
        except WorkerError as error:  # its message holds the worker's traceback: enough
            raise error.with_traceback(None) from None
        except KeyboardInterrupt:  # the pool has said what became of the workers
            raise KeyboardInterrupt from None

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
        if options.action is not None:
            raise ValueError(f"%distributed knows 'close' and 'restart', got {options.action!r}.")
        return self._pool(options)

    def _pool(self, options: Any) -> WorkerPool:
        return self._choose(options)[0]

    def _choose(self, options: Any) -> tuple[WorkerPool, bool]:
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
            if not pool.closed:
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
            pool = WorkerPool(num_processes=wanted, num_nodes=options.num_nodes, cluster=client)
        else:
            pool = WorkerPool(num_processes=wanted or _default_size())
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


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext notebook_kit``: register the ``distributed`` magics with this shell."""
    ipython.register_magics(DistributedMagics(ipython))
