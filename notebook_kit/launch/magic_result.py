"""A ``%%distributed --noblock`` cell runs on the pool in the background; this is its handle.

The cell returns at once with a :class:`DistributedResult` as its value (``_``). Its command runs
on a thread of the kernel that was started in the cell's own context: ipykernel reads the cell a
message belongs to from that context, so the workers' lines, and the live view when the run
lasts, keep appearing under the cell that started it while later cells run. The command takes
its place in the pool's line before the cell returns, so the next cell's command waits for it,
as every command of a pool waits its turn. The handle is ipyparallel's ``AsyncResult`` in small:
:meth:`~DistributedResult.done`, :meth:`~DistributedResult.result`,
:meth:`~DistributedResult.results`, :meth:`~DistributedResult.wait`, and
:meth:`~DistributedResult.interrupt` in place of the Ctrl-C a background command never gets.

Runs in the kernel.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

from notebook_kit.launch.pool.turns import tell_when_in_line
from notebook_kit.launch.pool.view import interrupt_with

__all__ = ["DistributedResult", "start_in_background"]


class DistributedResult:
    """What a ``--noblock`` cell returns: its values once every rank it runs on has answered.

    Example::

        %%distributed --noblock
        train(epochs=3)

        handle = _
        handle.done()          # False while it runs
        handle.interrupt()     # as Ctrl-C does a blocking cell
        handle.result()        # waits; rank 0's value of the last expression, or its error
        handle.results()       # {rank: value} of every rank it ran on
    """

    def __init__(self, label: str, ranks: list[int] | None) -> None:
        self.label = label
        self.ranks = ranks  # None: every rank of the pool
        self._finished = threading.Event()
        self._interrupt = threading.Event()
        self._values: dict[int, Any] = {}
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True once the cell has ended on every rank it runs on (with a value or an error)."""
        return self._finished.is_set()

    def interrupt(self) -> None:
        """Interrupt the cell on every rank it runs on, as Ctrl-C does a blocking cell: a
        ``KeyboardInterrupt`` in the ranks' code, and the workers stopped if one cannot
        take it within a second; :meth:`result` then raises ``KeyboardInterrupt``."""
        if not self.done():
            self._interrupt.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the cell has ended (at most ``timeout`` seconds); whether it has."""
        return self._finished.wait(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """Rank 0's value of the cell's last expression (the lowest rank it ran on), once done.

        Raises:
            TimeoutError: It is still running after ``timeout`` seconds.
            PoolRunError: A rank raised; the message names it. Any error that ended the cell
                is raised here, as the blocking cell would have raised it.
        """
        values = self.results(timeout)
        return values[min(values)] if values else None

    def results(self, timeout: float | None = None) -> dict[int, Any]:
        """Every rank's value of the cell's last expression, ``{rank: value}``, once done."""
        if not self._finished.wait(timeout):
            raise TimeoutError(
                f"The --noblock cell {self.label} is still running after {timeout:g} s; "
                "wait longer, or check .done() first."
            )
        if self._error is not None:
            raise self._error
        return dict(self._values)

    def __repr__(self) -> str:
        where = "every rank" if self.ranks is None else f"ranks {self.ranks}"
        if not self.done():
            state = "running"
        elif self._error is not None:
            state = f"failed: {type(self._error).__name__}"
        else:
            state = "done"
        return f"<DistributedResult of {self.label} on {where}: {state}>"

    def _finish(self, values: dict[int, Any], error: BaseException | None) -> None:
        self._values, self._error = values, error
        self._finished.set()


def start_in_background(
    handle: DistributedResult,
    run: Callable[[], dict[int, Any]],
    when_done: Callable[[dict[int, Any]], None],
) -> None:
    """Run ``run`` (one pool command) on a thread in this cell's context; return once the
    command has its place in the pool's line. ``when_done`` gets the values of a run that
    succeeded (``--out``)."""
    in_line = threading.Event()
    context = contextvars.copy_context()  # this cell's: its output stays under this cell

    def body() -> None:
        tell_when_in_line(in_line)
        interrupt_with(handle._interrupt)
        values: dict[int, Any] = {}
        error: BaseException | None = None
        try:
            values = run()
            when_done(values)
        except KeyboardInterrupt as raised:  # the pool has said what became of the workers
            error = raised
        except BaseException as raised:  # kept for .result(); the thread itself ends quietly
            error = raised
            first = (str(raised).splitlines() or [""])[0]
            print(
                f"The --noblock cell {handle.label} failed: {type(raised).__name__}: {first} "
                "(its .result() and `%distributed wait` raise it).",
                flush=True,
            )
        finally:
            in_line.set()
            handle._finish(values, error)

    thread = threading.Thread(
        target=context.run, args=(body,), name=f"notebook_kit {handle.label}", daemon=True
    )
    thread.start()
    while not in_line.wait(0.05) and thread.is_alive():
        pass
