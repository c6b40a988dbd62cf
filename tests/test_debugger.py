"""A rank's pdb, both halves in one process: the worker's channel and the kernel's desk."""

from __future__ import annotations

import multiprocessing
import sys
from typing import Any

import pytest

from notebook_kit.launch.debugger_desk import DebuggerDesk
from notebook_kit.launch.stall_watch import describe_stall
from notebook_kit.runtime.codec import ProtocolError
from notebook_kit.runtime.messages import (
    DebuggerLeft,
    DebuggerLine,
    DebuggerPrompt,
    decode,
    decode_line,
    encode,
    encode_line,
)
from notebook_kit.worker import debugger
from notebook_kit.worker.debugger import DebuggerQuit, break_ranks


def test_the_messages_go_through_the_codec_and_a_line_is_nothing_else():
    prompt = DebuggerPrompt(1, "> f.py(3)f()\n", "(Pdb rank 1) ", "f.py:2")
    assert decode(encode(prompt)) == prompt
    assert decode(encode(DebuggerLeft(0, "bye\n"))) == DebuggerLeft(0, "bye\n")
    assert decode_line(encode_line(DebuggerLine(None, True))) == DebuggerLine(None, True)
    with pytest.raises(ProtocolError):
        decode_line(encode(DebuggerLeft(0, "")))


def test_break_ranks_reads_commas_and_refuses_anything_else_naming_the_variable():
    assert break_ranks("") is None
    assert break_ranks(" 1 ") == {1}
    assert break_ranks("0,2") == {0, 2}
    for bad in ("one", "-1", ",", "1;2"):
        with pytest.raises(ValueError, match=r"NOTEBOOK_KIT_BREAK_RANKS=.*'0,2'"):
            break_ranks(bad)


# -- the worker's side, with this thread as the kernel -----------------------------------


class _Kernel:
    """The kernel's half for a session in this process: answers each prompt from ``lines``."""

    def __init__(self, lines: list[DebuggerLine], rank: int = 1) -> None:
        reader, self.writer = multiprocessing.Pipe(duplex=False)
        self.sent: list[Any] = []
        self.lines = list(lines)
        self.session = debugger._Session(rank, self.send, reader)

    def send(self, message: Any) -> None:
        self.sent.append(message)
        if isinstance(message, DebuggerPrompt):
            self.writer.send_bytes(encode_line(self.lines.pop(0)))

    def output(self) -> str:
        return "".join(m.output for m in self.sent)


def _stops(session: Any) -> int:
    secret = 41
    session.hook()
    return secret + 1


_WHERE = f"test_debugger.py:{_stops.__code__.co_firstlineno + 2}"  # its breakpoint


def _with_trace_restored(body: Any) -> Any:
    """pdb sets a trace function; coverage, or a debugger running the tests, may have one."""
    before = sys.gettrace()
    try:
        return body()
    finally:
        sys.settrace(before)


def test_p_shows_the_ranks_local_and_c_goes_on_with_one_leaving_message():
    kernel = _Kernel([DebuggerLine("p secret"), DebuggerLine("c")])
    assert _with_trace_restored(lambda: _stops(kernel.session)) == 42
    prompts = [m for m in kernel.sent if isinstance(m, DebuggerPrompt)]
    assert [p.prompt for p in prompts] == ["(Pdb rank 1) "] * 2
    assert prompts[0].location.endswith(_WHERE)
    assert "41\n" in prompts[1].output
    assert isinstance(kernel.sent[-1], DebuggerLeft)


def test_q_raises_debugger_quit_naming_where_and_interrupted_raises_keyboard_interrupt():
    kernel = _Kernel([DebuggerLine("q")])
    with pytest.raises(DebuggerQuit, match=r"quit the debugger \(q\) at .*test_debugger.py"):
        _with_trace_restored(lambda: _stops(kernel.session))
    kernel = _Kernel([DebuggerLine(None, interrupted=True)])
    with pytest.raises(KeyboardInterrupt):
        _with_trace_restored(lambda: _stops(kernel.session))


def test_no_line_skips_the_breakpoint_once_per_place_with_the_rank_and_place_named():
    why = "this frontend allows no input"
    kernel = _Kernel([DebuggerLine(None, why=why), DebuggerLine(None, why=why)])
    for _ in range(2):
        assert _with_trace_restored(lambda: _stops(kernel.session)) == 42
    said = [m.output for m in kernel.sent if isinstance(m, DebuggerLeft)]
    assert len(said) == 1 and said[0].startswith("breakpoint() on rank 1 at "), said
    assert f"{_WHERE} skipped: this frontend allows no input" in said[0]


def test_a_rank_not_chosen_skips_without_asking(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("NOTEBOOK_KIT_BREAK_RANKS", "0")
    kernel = _Kernel([])
    assert _stops(kernel.session) == 42
    assert [type(m) for m in kernel.sent] == [DebuggerLeft]
    assert "NOTEBOOK_KIT_BREAK_RANKS=0" in kernel.sent[0].output


# -- the kernel's side -------------------------------------------------------------------


class _Desk:
    def __init__(self, lines: list[str | None]) -> None:
        self.lines, self.asked, self.said, self.answers = list(lines), [], [], []
        self.desk = DebuggerDesk(ask=self.ask, say=self.said.append)

    def ask(self, output: str, prompt: str) -> str | None:
        self.asked.append((output, prompt))
        line = self.lines.pop(0)
        if line == "^C":
            raise KeyboardInterrupt
        return line

    def turn(self) -> float:
        return self.desk.turn(lambda rank, line: self.answers.append((rank, line)))


def _prompt(rank: int, output: str = "") -> DebuggerPrompt:
    return DebuggerPrompt(rank, output, f"(Pdb rank {rank}) ", "f.py:2")


def test_the_desk_keeps_one_rank_at_the_prompt_and_names_the_one_that_waits():
    desk = _Desk(["p x", "c", "c"])
    desk.desk.receive(_prompt(1, "> here\n"))
    desk.desk.receive(_prompt(0))
    desk.turn()
    assert desk.asked[0] == ("> here\nrank 0 is also at a breakpoint, next\n", "(Pdb rank 1) ")
    desk.desk.receive(_prompt(1, "5\n"))
    desk.turn()  # rank 1 again: it holds the prompt until it leaves
    assert desk.asked[1] == ("5\n", "(Pdb rank 1) ")
    assert desk.turn() == 0.0  # rank 1 runs on after "c": rank 0 waits for its leaving
    desk.desk.receive(DebuggerLeft(1, ""))
    assert desk.desk.ranks() == {0}
    desk.turn()
    assert desk.asked[2] == ("", "(Pdb rank 0) ")
    assert [(r, line.text) for r, line in desk.answers] == [(1, "p x"), (1, "c"), (0, "c")]


def test_the_desk_names_a_rank_that_stops_while_another_holds_the_prompt():
    desk = _Desk(["n"])
    desk.desk.receive(_prompt(1))
    desk.turn()
    desk.desk.receive(_prompt(0))
    assert desk.said == ["rank 0 is also at a breakpoint, next\n"]


def test_nobody_to_type_skips_without_holding_and_ctrl_c_tells_the_rank():
    desk = _Desk([None, None, "^C"])
    desk.desk.receive(_prompt(1))
    desk.desk.receive(_prompt(0))
    desk.turn()
    desk.turn()
    assert desk.said == [] and desk.desk.ranks() == set()
    assert [(r, line.text) for r, line in desk.answers] == [(1, None), (0, None)]
    desk.desk.receive(_prompt(1))
    with pytest.raises(KeyboardInterrupt):
        desk.turn()
    assert desk.answers[-1] == (1, DebuggerLine(None, interrupted=True))
    assert desk.desk.ranks() == set()


def test_the_stall_report_says_a_rank_at_the_prompt_is_in_the_debugger():
    answers = {0: [{"collective": "dist.all_reduce", "stack": "  File x\n"}]}
    report = describe_stall(60, {0, 1}, answers, in_debugger={1})
    assert "rank 1 is in the debugger" in report
    assert "never joined" not in report  # rank 0 waits for a rank at the prompt: expected


@pytest.mark.integration
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_bad_break_ranks_value_is_refused_before_any_process_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from notebook_kit import notebook_launcher

    monkeypatch.setenv("NOTEBOOK_KIT_BREAK_RANKS", "one")
    with pytest.raises(ValueError, match=r"NOTEBOOK_KIT_BREAK_RANKS='one' is not a list of ranks"):
        notebook_launcher(lambda: 1, num_processes=2)
    assert "Launching" not in capsys.readouterr().out


def _stops_on_every_rank() -> int:
    import torch.distributed as dist

    breakpoint()
    return dist.get_rank() + 5


@pytest.mark.integration
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_launch_with_no_cell_or_terminal_skips_each_ranks_breakpoint_and_goes_on(
    capsys: pytest.CaptureFixture[str],
):
    from notebook_kit import notebook_launcher

    assert notebook_launcher(_stops_on_every_rank, num_processes=2) == 5
    shown = capsys.readouterr().out
    for rank in (0, 1):
        assert f"breakpoint() on rank {rank} at " in shown, shown
    assert shown.count("skipped: no cell or terminal can answer here") == 2, shown
