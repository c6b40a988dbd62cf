"""A cluster node's desk for its ranks' pdb prompts: sent home, answered with the kernel's lines."""

from __future__ import annotations

from notebook_kit.launch.node_process.node_debugger import RelayedDesk
from notebook_kit.node.protocol import DebuggerAnswer
from notebook_kit.runtime.messages import DebuggerLeft, DebuggerLine, DebuggerPrompt

PROMPT = DebuggerPrompt(3, "> train.py(12)\n", "(Pdb rank 3) ", "train.py:12")


def _desk() -> tuple[RelayedDesk, list[object], list[tuple[int, DebuggerLine]]]:
    sent: list[object] = []
    written: list[tuple[int, DebuggerLine]] = []
    desk = RelayedDesk(sent.append)
    return desk, sent, written


def test_a_prompt_goes_home_and_the_kernels_line_is_written_to_that_rank_once() -> None:
    desk, sent, written = _desk()
    desk.receive(PROMPT)
    assert sent == [PROMPT] and desk.ranks() == {3}  # at the prompt: not stuck
    desk.take(DebuggerAnswer(3, DebuggerLine("p x")))
    assert desk.turn(lambda rank, line: written.append((rank, line))) == 0.0
    assert written == [(3, DebuggerLine("p x"))] and desk.ranks() == set()
    desk.take(DebuggerAnswer(3, DebuggerLine("c")))  # no prompt is waiting for it: dropped
    desk.turn(lambda rank, line: written.append((rank, line)))
    assert len(written) == 1


def test_a_line_for_a_rank_of_another_node_is_not_written_here() -> None:
    desk, _, written = _desk()
    desk.receive(PROMPT)
    desk.take(DebuggerAnswer(1, DebuggerLine("c")))  # every node hears every line
    desk.turn(lambda rank, line: written.append((rank, line)))
    assert written == [] and desk.ranks() == {3}


def test_leaving_pdb_goes_home_and_a_dead_rank_gets_no_line() -> None:
    desk, sent, written = _desk()
    desk.receive(PROMPT)
    left = DebuggerLeft(3, "leaving\n")
    desk.receive(left)
    assert sent == [PROMPT, left] and desk.ranks() == set()
    desk.receive(PROMPT)
    desk.take(DebuggerAnswer(3, DebuggerLine("c")))
    desk.forget(3)  # the rank died before its line was written
    desk.turn(lambda rank, line: written.append((rank, line)))
    assert written == []
