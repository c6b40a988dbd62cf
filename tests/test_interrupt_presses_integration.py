"""The stop button pressed two or three times in quick succession, in a real Jupyter kernel.

An impatient user presses again while the launch stops its workers, draws its summary, or
while IPython prints the KeyboardInterrupt. Whenever the presses land, the cell must end with
exactly one KeyboardInterrupt error (so "Run All" stops there), no process left, and the next
launch must work — as a plain cell does.
"""

from __future__ import annotations

import time
from typing import Any

import psutil
import pytest

from tests.kernel_cells import cell_messages, is_template, real_kernel, run_cell

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

SETUP = """\
import time
from notebook_kit import notebook_launcher
def slow():
    time.sleep(30)
    return 'trained to the end'
notebook_launcher(lambda: 1, num_processes=2)  # the first launch's one-time costs, paid here
"""
LAUNCH = "notebook_launcher(slow, num_processes=2)\nprint('NEXT STATEMENT RAN')"

# (seconds after the cell starts, then the gaps between presses): as the launch starts, and
# during the run, with the repeats landing in the clean-up, the summary and the traceback. (A
# press before the cell's code runs at all is IPython's to handle, as in any cell.)
PRESSES = [
    (0.15, (0.1,)),
    (0.25, (0.1, 0.1)),
    (0.8, (0.3,)),
    (0.8, (0.5, 0.2)),
    (0.8, (0.2, 0.4)),
]


def _press(manager: Any, client: Any, code: str, first: float, gaps: tuple[float, ...]) -> tuple:
    """Run ``code``, press the stop button at ``first`` and after each gap; the cell's
    messages and its reply's status."""
    msg_id = client.execute(code)
    time.sleep(first)
    manager.interrupt_kernel()
    for gap in gaps:
        time.sleep(gap)
        manager.interrupt_kernel()
    messages = cell_messages(client, msg_id, timeout=60)
    reply = client.get_shell_msg(timeout=10)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=10)
    return messages, reply["content"]["status"]


def _single(error: dict[str, Any]) -> bool:
    """The error is one KeyboardInterrupt, not one raised while handling another."""
    return "During handling of the above exception" not in "\n".join(error["traceback"])


def _left_below(kernel: psutil.Process) -> list[psutil.Process]:
    """Every process below the kernel, zombies included, but its clean template."""
    return [p for p in kernel.children(recursive=True) if not is_template(p)]


def test_two_or_three_quick_presses_end_a_launch_with_one_keyboard_interrupt() -> None:
    with real_kernel() as (manager, client):
        kernel = psutil.Process(manager.provisioner.process.pid)
        run_cell(client, SETUP, timeout=120)
        seen = []
        for first, gaps in PRESSES:
            messages, status = _press(manager, client, LAUNCH, first, gaps)
            errors = [m["content"]["ename"] for m in messages if m["msg_type"] == "error"]
            streams = [m["content"] for m in messages if m["msg_type"] == "stream"]
            stderr = "".join(s["text"] for s in streams if s["name"] == "stderr")
            stdout = "".join(s["text"] for s in streams if s["name"] == "stdout")
            left = _left_below(kernel)
            seen.append((first, gaps, errors, status, "KeyboardInterrupt" in stderr, left))
            assert errors == ["KeyboardInterrupt"] and status == "error", seen[-1]
            error = next(m["content"] for m in messages if m["msg_type"] == "error")
            assert _single(error), (first, gaps, "\n".join(error["traceback"]))
            assert "KeyboardInterrupt" not in stderr and "NEXT STATEMENT RAN" not in stdout
            assert not left, f"processes outlived the interrupted cell: {left}"
            time.sleep(1.2)  # a press absorbed after the cell would not reach the next one
        after = run_cell(client, "notebook_launcher(lambda: 7 * 6, num_processes=2)")
        results = [m for m in after if m["msg_type"] == "execute_result"]
        assert results and results[0]["content"]["data"]["text/plain"] == "42", after


SWEEP = """\
import os, signal, threading
def quick():
    time.sleep(1.5)
    return 'trained to the end'
def press(after):  # the stop button: SIGINT to the kernel's process group
    threading.Timer(after, os.killpg, (os.getpgid(0), signal.SIGINT)).start()
def launch(function):
    try:
        return notebook_launcher(function, num_processes=2, live=False)
    except KeyboardInterrupt:
        return 'interrupted'
press(0.8)
first = launch(slow)
press(0.3)  # a repeat of the press that ended it, landing in the launch that follows
second = launch(quick)
time.sleep(1.2)
press(0.3)  # a new press
third = launch(slow)
print('OUTCOMES', first, second, third)"""


def test_a_launch_right_after_a_caught_interrupt_absorbs_its_repeats_but_not_a_new_press():
    """A sweep that catches the KeyboardInterrupt and goes on to its next setting: a repeat
    of the press lands in the next launch, which trains to the end; a later press ends it."""
    with real_kernel() as (_, client):
        run_cell(client, SETUP, timeout=120)
        stdout = _stdout(run_cell(client, SWEEP, timeout=120))
        assert "OUTCOMES interrupted trained to the end interrupted" in stdout, stdout


BACKGROUND = """\
import threading, time
pool = %distributed
got = []
def background():
    for _ in range(3):
        got.append(pool.run(lambda: (time.sleep(0.2), 'thread')[1], ranks='all'))
caller = threading.Thread(target=background)
caller.start()"""
# (cell, presses, whether the workers keep what they hold): Python code is interrupted on
# every rank; code blocked in C gets its workers stopped.
POOL_PRESSES = [
    ("%%distributed\nwhile True:\n    pass", (0.8, (0.2, 0.3)), True),
    ("pool.run(lambda: time.sleep(60))\nprint('NEXT STATEMENT RAN')", (0.8, (0.5, 0.5)), False),
    ("%%distributed\ntime.sleep(60)", (0.8, (0.5, 0.2)), False),
]


def _value(messages: list[dict[str, Any]]) -> str:
    results = [m for m in messages if m["msg_type"] == "execute_result"]
    return results[0]["content"]["data"]["text/plain"] if results else ""


def _stdout(messages: list[dict[str, Any]]) -> str:
    streams = [m["content"] for m in messages if m["msg_type"] == "stream"]
    return "".join(s["text"] for s in streams if s["name"] == "stdout")


def test_quick_presses_end_a_pool_command_with_one_keyboard_interrupt() -> None:
    with real_kernel() as (manager, client):
        run_cell(client, "%load_ext notebook_kit")
        started = run_cell(client, "%%distributed\nimport time\nkept = 'yes'", timeout=120)
        assert "2 processes" in _stdout(started)  # no GPU here: two workers by default
        # A thread's pool.run and a %%distributed cell at the same time: one after the other.
        run_cell(client, BACKGROUND)
        assert _value(run_cell(client, "%%distributed\ntime.sleep(0.2)\n'cell'")) == "'cell'"
        joined = run_cell(client, "caller.join(30)\ngot")
        assert _value(joined) == str([["thread", "thread"]] * 3), joined
        for cell, (first, gaps), kept in POOL_PRESSES:
            messages, status = _press(manager, client, cell, first, gaps)
            errors = [m["content"] for m in messages if m["msg_type"] == "error"]
            assert [e["ename"] for e in errors] == ["KeyboardInterrupt"], (cell, messages)
            assert status == "error" and _single(errors[0]), (cell, errors)
            assert "NEXT STATEMENT RAN" not in _stdout(messages)
            after = run_cell(client, "%%distributed\n'kept' in globals()", timeout=120)
            assert _value(after) == str(kept), (cell, after)
            if not kept:
                run_cell(client, "%%distributed\nimport time\nkept = 'yes'")
            time.sleep(1.2)


LATE_REPEAT = """\
import os, signal, threading
def press(after):  # the stop button: SIGINT to the kernel's process group
    threading.Timer(after, os.killpg, (os.getpgid(0), signal.SIGINT)).start()
def late():  # runs after the cell's code, where the kernel flushes output and replies
    get_ipython().events.unregister('post_execute', late)
    press(0.05)
    time.sleep(0.5)
press(0.8)
try:
    notebook_launcher(slow, num_processes=2, live=False)
finally:
    get_ipython().events.register('post_execute', late)"""


def test_a_repeat_landing_after_the_cells_code_still_gets_the_cell_its_reply() -> None:
    """The second press arrives once the cell's code has ended, while the kernel finishes the
    request: it is absorbed there too, so the cell gets its one error and its reply."""
    with real_kernel() as (_, client):
        run_cell(client, SETUP, timeout=120)
        msg_id = client.execute(LATE_REPEAT)
        messages = cell_messages(client, msg_id, timeout=60)
        reply = client.get_shell_msg(timeout=10)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=10)
        errors = [m["content"]["ename"] for m in messages if m["msg_type"] == "error"]
        streams = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
        assert errors == ["KeyboardInterrupt"] and reply["content"]["status"] == "error"
        assert "KeyboardInterrupt" not in streams, streams
        assert _value(run_cell(client, "notebook_launcher(lambda: 7 * 6, num_processes=2)")) == "42"
