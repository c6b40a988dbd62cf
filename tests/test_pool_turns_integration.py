"""One pool command at a time, from many threads or asyncio tasks; messages that say what became
of the workers. Real forked workers, from plain Python."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from notebook_kit import WorkerPool
from notebook_kit.launch.pool.backend import RunOutcome
from notebook_kit.launch.pool.results import run_summary
from notebook_kit.launch.pool.turns import Turns
from notebook_kit.live.summary import summary_line

pytestmark = [pytest.mark.usefixtures("no_leftover_processes")]


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    shared = WorkerPool(num_processes=2, live=False)
    shared.run_cell("import time, torch.distributed as dist\nrank = dist.get_rank()")
    yield shared
    shared.close()


def _tagged(tag: str, seconds: float = 0.2) -> str:
    time.sleep(seconds)
    return tag


def _commands(pool: WorkerPool, tag: str, rounds: int) -> list[object]:
    """Every kind of command, each answer checked against this caller's own tag."""
    seen: list[object] = []
    for index in range(rounds):
        seen.append(pool.run(_tagged, tag, 0.1, ranks="all"))
        seen.append(pool.run_cell(f"mine_{tag} = '{tag}{index}'\ntime.sleep(0.05)\nmine_{tag}"))
        pool.push(**{f"pushed_{tag}": f"{tag}{index}"})
        seen.append(pool.pull(f"pushed_{tag}", rank=1))
    return seen


def _expected(tag: str, rounds: int) -> list[object]:
    return [x for i in range(rounds) for x in ([tag, tag], f"{tag}{i}", f"{tag}{i}")]


@pytest.mark.integration
def test_commands_from_threads_never_interleave(pool: WorkerPool) -> None:
    results: dict[str, list[object]] = {}
    errors: list[BaseException] = []

    def caller(tag: str) -> None:
        try:
            results[tag] = _commands(pool, tag, rounds=2)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=caller, args=(tag,), daemon=True) for tag in "ABC"]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 45  # within the per-test bound: a mixed-up wait fails here
    for thread in threads:
        thread.join(timeout=max(deadline - time.monotonic(), 0))
    assert not errors, errors
    assert results == {tag: _expected(tag, 2) for tag in "ABC"}
    assert pool.run(_tagged, "after", 0, ranks="all") == ["after", "after"]


@pytest.mark.integration
def test_commands_from_asyncio_tasks_never_interleave(pool: WorkerPool) -> None:
    async def both() -> list[object]:
        return await asyncio.gather(
            asyncio.to_thread(pool.run, _tagged, "D", 0.3, ranks="all"),
            asyncio.to_thread(_commands, pool, "E", 1),
            asyncio.to_thread(pool.run_cell, "time.sleep(0.2)\n'F'"),
        )

    assert asyncio.run(both()) == [["D", "D"], _expected("E", 1), "F"]


@pytest.mark.integration
def test_waiting_callers_are_served_in_the_order_they_called(pool: WorkerPool) -> None:
    finished: list[str] = []

    def caller(tag: str) -> None:
        pool.run(_tagged, tag, 0.3)
        finished.append(tag)

    threads = []
    for tag in "PQRS":
        threads.append(threading.Thread(target=caller, args=(tag,)))
        threads[-1].start()
        time.sleep(0.1)  # each calls while the earlier ones still run or wait
    for thread in threads:
        thread.join(timeout=60)
    assert finished == list("PQRS")


def test_a_command_from_the_thread_whose_command_runs_is_refused() -> None:
    turns = Turns()
    refused = pytest.raises(RuntimeError, match=r"pool\.push was called while a command")
    with turns.take("pool.run"), refused, turns.take("pool.push"):
        pass
    with turns.take("pool.run"):  # the refused call left the turn as it was
        pass


@pytest.mark.integration
def test_a_timeout_the_workers_cannot_stop_for_is_a_timeout_error_that_says_they_were_stopped() -> (
    None
):
    with WorkerPool(num_processes=2, timeout=1.0, live=False) as timed:
        pids = timed.pids
        with pytest.raises(TimeoutError, match=r"timeout=1\.0 s") as raised:
            timed.run_cell("import time\ntime.sleep(30)")
        assert "workers were stopped" in str(raised.value) and "lost" in str(raised.value)
        assert timed.pids == [] and timed.run_cell("6 * 7") == 42
        assert set(timed.pids).isdisjoint(pids)


def test_the_summary_line_and_the_error_agree_on_what_became_of_the_workers() -> None:
    kept = run_summary(RunOutcome(timed_out=True), None, {0: None}, time.monotonic(), False)
    assert "the workers keep their state" in summary_line(kept)
    stopped = run_summary(
        RunOutcome(timed_out=True), KeyboardInterrupt(), {0: -9}, time.monotonic(), False
    )
    assert "all workers stopped" in summary_line(stopped)


def _written() -> int:
    """Bytes this process has written so far (pipes included)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["wchar"])


@pytest.mark.integration
def test_an_interrupted_push_says_in_its_own_call_that_the_workers_were_stopped(
    pool: WorkerPool, capsys: pytest.CaptureFixture[str]
) -> None:
    big = torch.zeros(48 * 2**20 // 4)
    start = _written()

    def interrupt_while_sending() -> None:  # once a few MiB of the push went down the pipes
        deadline = time.monotonic() + 60
        while _written() - start < 8 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_while_sending, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        pool.push(big=big)
    out = capsys.readouterr().out
    assert "Interrupted while the command was being sent" in out, out
    assert "the workers were stopped" in out and "lost" in out
    assert pool.pids == []
    assert pool.run_cell("1 + 1") == 2  # new workers, said at the start of this call
    assert "Starting 2 new workers" in capsys.readouterr().out
