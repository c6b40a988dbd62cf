"""Every rank's stacks on demand: ``notebook_kit.stacks()`` while a run is in progress.

Real workers, a real gloo collective: rank 0 sleeps in C (``time.sleep``), rank 1 waits in
``dist.all_reduce`` for it. The stacks are asked from another thread of the process that
supervises the run (a blocking launch, a pool command), and from the event loop's own thread
while an awaited launch runs as a task; each answer comes within the call's timeout and names
where each rank is. Then the run is interrupted, as Ctrl-C would, and nothing is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

import notebook_kit
from notebook_kit import WorkerPool, notebook_launcher, notebook_launcher_async
from notebook_kit.launch import native_stacks
from notebook_kit.launch.stack_requests import (
    NO_RUN,
    RankStacks,
    StackDesk,
    ask_stacks,
    gather,
    process_state,
)
from notebook_kit.live.observer import LaunchObserver

pytestmark = [pytest.mark.usefixtures("no_leftover_processes")]

TIMEOUT = 2.0
# A rank that does not answer at all makes the call last its whole timeout, no more: this slack
# only absorbs the thread switches of a loaded machine, never a wait of the call's own.
SLACK = 1.0


def _sleep_or_reduce() -> None:
    if dist.get_rank() == 0:
        time.sleep(60)  # rank 0 sleeps here, in C
    else:
        dist.all_reduce(torch.zeros(1))  # rank 1 waits here for rank 0


def _both_in_place(answer: dict[int, str]) -> bool:
    return "time.sleep(60)" in answer.get(0, "") and "dist.all_reduce" in answer.get(1, "")


def _ask_until_in_place(
    found: list[tuple[RankStacks, float]], ask: Any = notebook_kit.stacks
) -> None:
    """Ask (as a second cell thread would) until both ranks are where the function puts them."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            answer = ask(TIMEOUT)
        except RuntimeError as error:  # the run has not started yet
            assert str(error) == NO_RUN
            time.sleep(0.05)
            continue
        found.append((answer, time.monotonic() - started))
        if _both_in_place(answer):
            return
        time.sleep(0.1)


def _asker_then_interrupt(found: list[tuple[RankStacks, float]]) -> threading.Thread:
    def ask_then_interrupt() -> None:
        try:
            _ask_until_in_place(found)
        finally:  # Ctrl-C, as the kernel's interrupt: the run stops
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    thread = threading.Thread(target=ask_then_interrupt, daemon=True)
    thread.start()
    return thread


def _check_answer(found: list[tuple[RankStacks, float]]) -> None:
    assert found, "stacks() never answered"
    answer = found[-1][0]
    assert _both_in_place(answer), str(answer)
    assert sorted(answer) == [0, 1]
    assert "in _sleep_or_reduce" in answer[0] and "waiting in dist.all_reduce" in answer[1]
    assert "all_reduce(torch.zeros(1))" in answer[1], answer[1]
    assert all(seconds < TIMEOUT + SLACK for _, seconds in found), [s for _, s in found]
    if native_stacks.py_spy() is not None:  # the C frame under time.sleep, read from outside
        assert "native frames (py-spy dump --native)" in answer[0]
        assert "sleep" in answer[0].split("native frames")[1], answer[0]
        assert answer.note is None
    else:
        assert answer.note == native_stacks.MISSING and str(answer).count("Python frames only") == 1


@pytest.mark.integration
def test_stacks_from_another_thread_name_the_sleep_and_the_all_reduce_then_the_run_stops() -> None:
    found: list[tuple[RankStacks, float]] = []
    thread = _asker_then_interrupt(found)
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(_sleep_or_reduce, num_processes=2, live=False, timeout=90)
    thread.join(5)
    _check_answer(found)
    with pytest.raises(RuntimeError, match="no launch or WorkerPool command is running"):
        notebook_kit.stacks()  # the run is over: nothing to ask


@pytest.mark.integration
def test_stacks_during_a_pool_command_then_the_pool_closes_with_nothing_left() -> None:
    found: list[tuple[RankStacks, float]] = []
    with WorkerPool(num_processes=2, live=False) as pool:
        pool.run(lambda: 1)  # the workers are up: the next command is the one asked
        thread = _asker_then_interrupt(found)
        with pytest.raises(KeyboardInterrupt):
            pool.run(_sleep_or_reduce)
        thread.join(5)
    _check_answer(found)


@pytest.mark.integration
def test_stacks_on_the_event_loops_thread_while_an_awaited_launch_runs_as_a_task() -> None:
    """The next cell while ``notebook_launcher_async`` runs as a task: the same thread."""
    found: list[tuple[RankStacks, float]] = []

    async def main() -> None:
        task = asyncio.ensure_future(
            notebook_launcher_async(_sleep_or_reduce, num_processes=2, live=False, timeout=90)
        )
        deadline = time.monotonic() + 30
        while (not found or not _both_in_place(found[-1][0])) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # the loop turns the launch's steps meanwhile
            assert not task.done()
            started = time.monotonic()
            with contextlib.suppress(RuntimeError):  # not started yet
                answer = notebook_kit.stacks(TIMEOUT)  # blocks the event loop: pumps the run
                found.append((answer, time.monotonic() - started))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    _check_answer(found)


@pytest.mark.integration
def test_a_rank_that_cannot_answer_gets_its_pid_and_state_and_the_call_keeps_its_deadline() -> None:
    """A rank whose answering thread cannot run (stopped with SIGSTOP) is named, not waited for."""
    found: list[tuple[RankStacks, float]] = []
    pids: list[int] = []

    def stop_rank_one_then_ask() -> None:
        try:
            _ask_until_in_place(found)
            pids.extend(found[-1][0][1].split("(pid ")[1].split(")")[:1])
            os.kill(int(pids[0]), signal.SIGSTOP)
            started = time.monotonic()
            found.append((notebook_kit.stacks(0.5), time.monotonic() - started))
            os.kill(int(pids[0]), signal.SIGCONT)
        finally:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    thread = threading.Thread(target=stop_rank_one_then_ask, daemon=True)
    thread.start()
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(_sleep_or_reduce, num_processes=2, live=False, timeout=90)
    thread.join(5)
    answer, took = found[-1]
    assert took < 0.5 + SLACK, took
    assert "time.sleep(60)" in answer[0], answer[0]
    assert f"rank 1 (pid {pids[0]}): no answer within 0.5 s" in answer[1], answer[1]
    assert "process state T (stopped)" in answer[1], answer[1]


@pytest.mark.integration
def test_without_py_spy_the_text_says_once_that_only_python_frames_are_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(native_stacks, "py_spy", lambda: None)
    found: list[tuple[RankStacks, float]] = []
    thread = _asker_then_interrupt(found)
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(_sleep_or_reduce, num_processes=2, live=False, timeout=90)
    thread.join(5)
    answer, _ = found[-1]
    assert answer.note == native_stacks.MISSING
    assert str(answer).count("Python frames only") == 1 and "py-spy dump" not in str(answer)


def _nap(seconds: float) -> int:
    time.sleep(seconds)  # each rank naps here
    return dist.get_rank()


@pytest.mark.integration
def test_a_request_before_a_worker_can_answer_waits_for_it_and_kills_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The signal can reach a worker before its answering thread exists: it must wait there."""
    from notebook_kit.worker import entry

    answer_later = entry.answer_stack_requests

    def late(send: Any) -> None:  # inherited by the forked workers
        time.sleep(1.0)
        answer_later(send)

    monkeypatch.setattr(entry, "answer_stack_requests", late)
    found: list[RankStacks] = []

    def ask_at_once() -> None:
        """Until a request reached both ranks: right after their fork, well within the 1 s."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):  # the run has not started yet
                found.append(notebook_kit.stacks(5.0))
                if "not started yet" not in str(found[-1]):
                    return
            time.sleep(0.005)

    thread = threading.Thread(target=ask_at_once, daemon=True)
    thread.start()
    assert notebook_launcher(_nap, args=(3.0,), num_processes=2, live=False) == 0
    thread.join(10)
    assert found and sorted(found[-1]) == [0, 1], found
    # answered once its thread was there, from wherever the rank had got to by then
    assert all("main thread, not in a collective" in text for text in found[-1].values()), found


@pytest.mark.integration
def test_one_process_in_the_kernel_answers_from_its_own_thread_without_a_signal() -> None:
    """``num_processes=1`` runs in this process: its stack is read here (a signal would kill)."""
    found: list[RankStacks] = []

    def ask() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):  # not started yet
                answer = notebook_kit.stacks(TIMEOUT)
                if "naps here" in answer.get(0, ""):
                    found.append(answer)
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    assert notebook_launcher(_nap, args=(3.0,), num_processes=1, live=False) == 0
    thread.join(5)
    assert found and list(found[0]) == [0], found
    assert f"rank 0 (pid {os.getpid()}):" in found[0][0]
    assert "time.sleep(seconds)  # each rank naps here" in found[0][0]
    assert "py-spy dump" not in found[0][0]  # never run on the kernel itself


class _StacksButton(LaunchObserver):
    """A view whose button asks for the stacks from inside the run's loop, as a click handler
    would: the blocking call is refused there, and ``ask_stacks`` gives a future instead."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.refused = ""
        self.future: Any = None

    def on_start(self, info: Any) -> None:
        self.started = time.monotonic()

    def on_tick(self) -> None:
        if self.future is None and self.started and time.monotonic() - self.started > 1.5:
            try:
                notebook_kit.stacks()
            except RuntimeError as error:
                self.refused = str(error)
            self.future = ask_stacks(TIMEOUT)


@pytest.mark.integration
def test_a_view_inside_the_runs_loop_asks_without_waiting_and_reads_a_future() -> None:
    view = _StacksButton()
    assert notebook_launcher(_nap, args=(4.0,), num_processes=2, observer=view) == 0
    assert "call ask_stacks() there" in view.refused, view.refused
    answer = view.future.result(timeout=0)  # answered while the loop went on turning
    assert sorted(answer) == [0, 1]
    assert all("time.sleep(seconds)  # each rank naps here" in t for t in answer.values()), answer


def test_without_a_run_or_with_a_bad_timeout_the_error_says_what_to_do() -> None:
    with pytest.raises(RuntimeError) as raised:
        notebook_kit.stacks()
    assert "while one runs: from another thread" in str(raised.value)
    with pytest.raises(RuntimeError, match="no launch or WorkerPool command"):
        ask_stacks()
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(
            ValueError, match=r"stacks\(timeout=.*\): timeout must be above 0 seconds"
        ):
            notebook_kit.stacks(bad)
    for wrong in (None, "2", True):
        with pytest.raises(TypeError, match="timeout must be a number of seconds"):
            notebook_kit.stacks(wrong)  # type: ignore[arg-type]


def test_a_request_left_at_a_run_that_just_ended_ends_at_once_with_the_error() -> None:
    """The caller found the run's desk, which closed before taking the request."""
    desk = StackDesk()
    desk.open(lambda limit: False)
    desk.close("the run ended")
    with pytest.raises(RuntimeError, match="ended while its stacks were being asked"):
        gather(desk, 20.0)  # not a wait until this deadline: an answer with no rank


def test_a_process_state_is_read_from_the_operating_system() -> None:
    assert process_state(os.getpid()).startswith(("R", "S"))
    assert process_state(2**22 + 12345) == ""
