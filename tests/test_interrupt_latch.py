"""The interrupt latch with real SIGINTs sent to this process: one press raises, repeats do not.

The kernel-level timing of quick presses is covered in a real kernel
(``test_interrupt_presses_integration.py``); here each rule of the latch is pinned down on its
own, with no timing left to chance.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from notebook_kit.launch import interrupts
from notebook_kit.launch.interrupts import (
    REPEAT_SECONDS,
    interrupt_latch,
    interrupt_taken,
    interrupts_deferred,
)


@pytest.fixture(autouse=True)
def _python_sigint_handler():
    """The latch only stands in for a Python handler, as the kernel's is."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _press() -> bool:
    """Send SIGINT to this process; True when it raised KeyboardInterrupt here."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100):  # the handler runs at one of the next bytecodes
            time.sleep(0.001)
    except KeyboardInterrupt:
        return True
    return False


def test_a_press_raises_once_and_its_quick_repeats_are_absorbed():
    with interrupt_latch():
        presses = [_press() for _ in range(3)]
    assert presses == [True, False, False]


def test_a_press_after_the_repeat_window_raises_again():
    with interrupt_latch():
        first = _press()
        time.sleep(REPEAT_SECONDS + 0.1)
        second = _press()
    assert (first, second) == (True, True)


def test_once_the_interrupt_is_taken_every_later_press_is_absorbed():
    with interrupt_latch():
        assert _press()
        interrupt_taken()
        time.sleep(REPEAT_SECONDS + 0.1)
        assert not _press()


def test_a_press_during_a_clean_up_is_delivered_once_when_it_ends():
    with interrupt_latch():
        with pytest.raises(KeyboardInterrupt), interrupts_deferred():
            held = [_press(), _press()]
        assert held == [False, False]
        assert not _press()  # a repeat of the press just delivered


def test_the_handler_is_the_kernels_again_after_the_block():
    with interrupt_latch():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert _press()


def test_a_press_on_an_instruction_without_a_line_is_raised_a_step_later(monkeypatch):
    """IPython cannot format a traceback through a frame CPython gives no line: such a press
    is handed on and raised at the next instruction that has one."""

    class LineLess:  # a frame stopped on an instruction without a line (a loop's own jump)
        f_lineno = None

    # The press comes back from a timer thread. With the product's 1 ms, on a loaded machine it
    # can come back before the handler has returned; 0.3 s leaves the handler time to return,
    # and the wait below is bounded generously (it runs out only if the press never returns).
    monkeypatch.setattr(interrupts, "_MOVE_SECONDS", 0.3)
    returned = []
    with interrupt_latch():
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt) as caught:
            handler(signal.SIGINT, LineLess())  # type: ignore[operator]
            returned.append(True)  # not raised there
            for _ in range(10_000):
                time.sleep(0.001)
        latch = interrupts._active
        assert latch is not None and latch.moved == 1
    assert returned == [True]
    assert all(isinstance(entry.lineno, int) for entry in caught.traceback)


def test_a_handed_on_press_that_comes_back_inside_the_handler_is_handed_on_again(monkeypatch):
    """On a loaded machine the handed-on press can come back before the handler returned: its
    frame is then the handler's own, and it must not be raised there either."""

    class InsideTheHandler:  # the frame a press coming back during the handler stops in
        f_lineno = 97
        f_code = interrupts._Latch.handle.__code__

    monkeypatch.setattr(interrupts, "_MOVE_SECONDS", 0.3)
    returned = []
    with interrupt_latch():
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, InsideTheHandler())  # type: ignore[operator]
            returned.append(True)  # not raised there
            for _ in range(10_000):
                time.sleep(0.001)
        latch = interrupts._active
        assert latch is not None and latch.moved == 1
    assert returned == [True]
