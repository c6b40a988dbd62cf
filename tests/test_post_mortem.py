"""Post-mortem of a failed rank without a kernel: the worker's pdb on a traceback, and what
``pool.debug()`` and ``post_mortem=`` refuse before anything is sent or started.

The prompts themselves, typed at in a real kernel, are in
``tests/test_post_mortem_kernel_integration.py``.
"""

from __future__ import annotations

import sys

import pytest

from notebook_kit.runtime.messages import DebuggerLeft, DebuggerLine, DebuggerPrompt
from notebook_kit.worker import debugger
from tests.test_debugger import _Kernel, _with_trace_restored


def _fails() -> None:
    x = 5
    x / 0


_RAISED_AT = f"test_post_mortem.py:{_fails.__code__.co_firstlineno + 2}"


def _error() -> ZeroDivisionError:
    try:
        _fails()
    except ZeroDivisionError as error:
        return error
    raise AssertionError("_fails did not raise")


def _post_mortem(kernel: _Kernel, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(sys, "breakpointhook", kernel.session.hook)  # as install_debugger does
    return _with_trace_restored(lambda: debugger.post_mortem(_error()))


def test_post_mortem_opens_in_the_failing_frame_with_its_locals_and_q_raises_nothing(
    monkeypatch: pytest.MonkeyPatch,
):
    kernel = _Kernel([DebuggerLine("p x"), DebuggerLine("q")])
    assert _post_mortem(kernel, monkeypatch) is True
    prompts = [m for m in kernel.sent if isinstance(m, DebuggerPrompt)]
    assert [p.prompt for p in prompts] == ["(Pdb rank 1) "] * 2
    assert prompts[0].location.endswith(_RAISED_AT), prompts[0].location
    assert prompts[0].output.startswith("Post-mortem of rank 1: ZeroDivisionError: division by")
    assert "x / 0" in prompts[0].output, prompts[0].output  # the failing line is shown
    assert prompts[1].output.strip() == "5"
    assert isinstance(kernel.sent[-1], DebuggerLeft)
    assert sum(isinstance(m, DebuggerLeft) for m in kernel.sent) == 1


@pytest.mark.parametrize("leave", ["c", "n"])
def test_c_or_a_step_ends_the_post_mortem_once(monkeypatch: pytest.MonkeyPatch, leave: str):
    kernel = _Kernel([DebuggerLine(leave)])
    assert _post_mortem(kernel, monkeypatch) is True
    assert [type(m) for m in kernel.sent] == [DebuggerPrompt, DebuggerLeft]


def test_nobody_to_type_says_the_post_mortem_was_skipped_and_where(
    monkeypatch: pytest.MonkeyPatch,
):
    kernel = _Kernel([DebuggerLine(None, why="this frontend allows no input")])
    assert _post_mortem(kernel, monkeypatch) is True
    said = [m.output for m in kernel.sent if isinstance(m, DebuggerLeft)]
    assert len(said) == 1, kernel.sent
    assert said[0].startswith("post-mortem on rank 1 at "), said
    assert f"{_RAISED_AT} skipped: this frontend allows no input" in said[0]


def test_ctrl_c_at_the_prompt_raises_keyboard_interrupt(monkeypatch: pytest.MonkeyPatch):
    kernel = _Kernel([DebuggerLine(None, interrupted=True)])
    with pytest.raises(KeyboardInterrupt):
        _post_mortem(kernel, monkeypatch)


def test_a_process_the_kernel_cannot_prompt_for_has_no_post_mortem(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(sys, "breakpointhook", sys.__breakpointhook__)
    assert debugger.post_mortem(_error()) is False


# -- bad input, before anything is sent or started ---------------------------------------


def test_post_mortem_must_be_true_or_false():
    from notebook_kit import WorkerPool, notebook_launcher

    with pytest.raises(TypeError, match=r"post_mortem must be True or False, got 'yes'"):
        notebook_launcher(lambda: 1, num_processes=2, post_mortem="yes")
    with pytest.raises(TypeError, match=r"post_mortem must be True or False, got 'yes'"):
        WorkerPool(num_processes=2, post_mortem="yes")


def _fail_on_rank_1() -> None:
    import torch.distributed as dist

    x = 5
    if dist.get_rank() == 1:
        x / 0


def _dies_on_rank_1() -> None:
    import os

    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(3)


@pytest.mark.integration
@pytest.mark.usefixtures("no_leftover_processes")
def test_pool_debug_refuses_what_it_cannot_open_and_otherwise_says_why_nobody_typed(
    capsys: pytest.CaptureFixture[str],
):
    from notebook_kit import WorkerError, WorkerPool

    with WorkerPool(num_processes=2, live=False) as pool:
        with pytest.raises(RuntimeError, match=r"the pool's last command did not fail"):
            pool.debug()
        with pytest.raises(WorkerError, match="ZeroDivisionError"):
            pool.run(_fail_on_rank_1)
        pids = pool.pids
        for rank, said in [
            (7, r"rank=7: rank 7 is not a rank of the pool \(the pool's ranks are 0 to 1\)"),
            (0, r"rank=0: rank 0 did not fail .* rank 1 failed\. Pass one of them"),
        ]:
            with pytest.raises(ValueError, match=said):
                pool.debug(rank=rank)
        with pytest.raises(TypeError, match=r"rank must be an integer"):
            pool.debug(rank="1")
        capsys.readouterr()
        pool.debug(rank=1)  # no terminal or cell here: the rank says it skipped, and answers
        shown = capsys.readouterr().out
        assert "post-mortem on rank 1 at " in shown and "skipped: no cell or terminal" in shown
        assert pool.run(lambda: 3) == 3 and pool.pids == pids  # the same workers, usable
        with pytest.raises(RuntimeError, match=r"the pool's last command did not fail"):
            pool.debug()  # that command succeeded: the failure's frames were dropped
        with pytest.raises(WorkerError):
            pool.run(_fail_on_rank_1)
        pool.restart()
        with pytest.raises(RuntimeError, match=r"are gone \(stopped or restarted since\)"):
            pool.debug()
        with pytest.raises(WorkerError):
            pool.run(_dies_on_rank_1)  # no Python frame is left of a rank that died
        with pytest.raises(RuntimeError, match=r"are gone \(the workers were stopped after it"):
            pool.debug(rank=1)


@pytest.mark.integration
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_launch_with_post_mortem_and_nobody_to_type_says_it_skipped_and_fails_as_usual(
    capsys: pytest.CaptureFixture[str],
):
    from notebook_kit import WorkerError, notebook_launcher

    with pytest.raises(WorkerError, match=r"[Rr]ank 1 .*ZeroDivisionError") as raised:
        notebook_launcher(_fail_on_rank_1, num_processes=2, post_mortem=True, live=False)
    assert raised.value.failure.rank == 1
    shown = capsys.readouterr().out
    assert "post-mortem on rank 1 at " in shown and "skipped: no cell or terminal" in shown
    assert notebook_launcher(lambda: 7, num_processes=2, live=False) == 7


def test_only_an_error_of_the_ranks_own_code_is_worth_a_post_mortem():
    peer_gone = RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234")
    assert debugger.worth_a_post_mortem(_error())
    assert not debugger.worth_a_post_mortem(peer_gone)  # the peer that went has its own
    assert not debugger.worth_a_post_mortem(debugger.DebuggerQuit("q at x.py:1"))
    assert not debugger.worth_a_post_mortem(KeyboardInterrupt())


_KEEPS_A_BIG_OBJECT = """\
import weakref
class Big:
    pass
def fails():
    big = Big()
    global seen
    seen = weakref.ref(big)
    1 / 0
fails()
"""


@pytest.mark.integration
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_pool_keeps_the_failed_frames_until_the_next_command_and_post_mortem_opens_at_once(
    capsys: pytest.CaptureFixture[str],
):
    from notebook_kit import WorkerError, WorkerPool

    with WorkerPool(num_processes=2, live=False, post_mortem=True) as pool:
        with pytest.raises(WorkerError, match="ZeroDivisionError"):
            pool.run_cell(_KEEPS_A_BIG_OBJECT)
        shown = capsys.readouterr().out  # each rank tried its post-mortem before answering
        assert shown.count("skipped: no cell or terminal") == 2, shown
        assert "post-mortem on rank 0 at <distributed cell" in shown, shown
        kept = "import gc\ngc.collect()\nseen() is not None"
        assert pool.run_cell(kept) is False  # that command dropped the failure's frames
