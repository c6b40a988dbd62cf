"""Ctrl-C at any moment of a launch, even in the middle of a fork, stops it.

Python runs a signal handler at the next bytecode; during ``os.fork`` that can be inside an
at-fork hook (logging has one), which discards the KeyboardInterrupt. The deterministic cases
send the interrupt from such a hook; the random ones at a random moment of the first 80 ms,
in a script and in a real Jupyter kernel.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.kernel_cells import real_kernel

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]

# Run by a script and by a kernel: `runs` launches of a 3 s function, each interrupted once.
LAUNCHES = textwrap.dedent(
    """
    import json, os, random, signal, threading, time

    armed = []
    sent_at = []  # when the last interrupt was sent: the launch must end soon after it

    def interrupt():
        sent_at.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    def interrupt_inside_the_fork():
        if armed:
            armed.clear()
            interrupt()

    os.register_at_fork(before=interrupt_inside_the_fork)

    from notebook_kit import notebook_launcher

    def train():
        time.sleep(3)
        return "trained to the end"

    def interrupted_launches(runs, when):
        outcomes = []
        for _ in range(runs):
            sent_at.clear()
            try:  # a timer that fires at once may interrupt its own start: count it too
                if when == "in-fork":
                    armed.append(True)
                else:
                    threading.Timer(random.uniform(0, 0.08), interrupt).start()
                notebook_launcher(train, num_processes=2, live=False)
                outcomes.append("finished")
            except KeyboardInterrupt:
                outcomes.append(round(time.monotonic() - sent_at[-1], 3))
            time.sleep(0.1)  # a timer that fired late must not hit the next launch
        return outcomes
    """
)


def _script_outcomes(runs: int, when: str) -> list:
    code = (
        "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        + LAUNCHES
        + f"\nprint('OUTCOMES', json.dumps(interrupted_launches({runs}, {when!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOMES")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(lines[0].removeprefix("OUTCOMES"))


def _check(outcomes: list, runs: int) -> None:
    assert len(outcomes) == runs
    finished = outcomes.count("finished")
    assert finished == 0, f"{finished} of {runs} interrupts were lost: {outcomes}"
    # Seconds from each interrupt to the launch's end: all well short of the 3 s function (a
    # first launch's warm-up import before the fork does not count: it precedes the interrupt).
    assert max(outcomes) < 2.0, outcomes


def test_an_interrupt_inside_the_fork_stops_the_launch():
    _check(_script_outcomes(5, "in-fork"), 5)


def test_an_interrupt_inside_a_fork_before_the_launch_is_delivered_after_it():
    # The kernel probe on a CUDA build forks before any worker: the same hole, another fork.
    code = (
        "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        + LAUNCHES
        + textwrap.dedent(
            """
            from notebook_kit.launch.interrupts import interrupts_survive_forks
            armed.append(True)
            try:
                with interrupts_survive_forks():
                    pid = os.fork()
                    if pid == 0:
                        os._exit(0)
                    os.waitpid(pid, 0)
                    print("NOT INTERRUPTED DURING THE BLOCK", flush=True)
            except KeyboardInterrupt:
                print("INTERRUPTED AFTER THE FORK")
            """
        )
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "INTERRUPTED AFTER THE FORK" in done.stdout, done.stdout + done.stderr[-2000:]


@pytest.mark.slow
def test_sixty_interrupts_at_random_moments_of_the_first_80_ms():
    _check(_script_outcomes(60, "random"), 60)


@pytest.mark.slow
@pytest.mark.parametrize("when, runs", [("in-fork", 5), ("random", 60)])
def test_interrupts_in_a_real_kernel_are_never_lost(when, runs):
    # One launch per cell, as a user re-runs it: within one cell, a press soon after a launch
    # ended on another is that press repeated, and absorbed (test_interrupt_presses_integration).
    outcomes = []
    with real_kernel() as (_, client):
        client.execute_interactive(LAUNCHES, timeout=120)
        for _ in range(runs):
            output: list[str] = []
            reply = client.execute_interactive(
                f"print('OUTCOMES', json.dumps(interrupted_launches(1, {when!r})))",
                timeout=60,
                output_hook=lambda m, output=output: output.append(m["content"].get("text", "")),
            )
            assert reply["content"]["status"] == "ok", reply["content"]
            text = "".join(output)
            line = next(line for line in text.splitlines() if line.startswith("OUTCOMES"))
            outcomes += json.loads(line.removeprefix("OUTCOMES"))
    _check(outcomes, runs)
