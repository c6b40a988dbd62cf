"""A cluster run's frames: every message comes back as it left, and nothing else is read.

What arrives on a run's topics may come from anyone who reaches the cluster: a bare pickle, a
frame of an unknown kind, a cut-off frame, or a frame sealed with another secret is refused
with ``ProtocolError`` before anything in it is unpickled.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import msgpack
import pytest
import torch

from notebook_kit.errors import WorkerFailure
from notebook_kit.node.protocol import (
    Interrupt,
    LaunchStop,
    NodeAnswer,
    NodeError,
    NodeFailed,
    NodeFinished,
    NodeInterrupted,
    NodePrint,
    NodeReady,
    NodeValue,
    ProtocolError,
    Rendezvous,
    RunCommand,
    Seal,
    StopCommand,
    decode,
    encode,
)
from notebook_kit.runtime import codec
from notebook_kit.runtime.messages import (
    Failure,
    MetricsBatch,
    OutputLine,
    PoolAnswer,
    Progress,
    RankSpeed,
)
from notebook_kit.runtime.pool_commands import PoolCell, PoolCheck, PoolClose, PoolPull

_FAILURE = WorkerFailure(1, -9, None, "killed by SIGKILL", "", 12.5, "dp=1")
_ANSWER = PoolAnswer(3, "error", Failure("ValueError", "bad", "tb", 2.0), {}, None, "detail")
MESSAGES = [
    OutputLine(1, "stderr", "a line"),
    MetricsBatch(0, ((0, 1, {"loss": 1.5}), (0, None, {})), 2, Progress(3, 10, 5), RankSpeed(4)),
    NodePrint("a stall report"),
    NodeReady(1, (101, 102)),
    NodeAnswer(0, 3, "stopped", {2: _ANSWER}, "a node was lost", (_FAILURE,)),
    NodeFinished(1, (2, 3), (_FAILURE,), True),
    NodeFailed((_FAILURE,)),
    NodeError("RuntimeError", "no", "tb"),
    NodeInterrupted(),
    RunCommand(4, PoolCell("x = 1", "<cell 1>", b"\x80body"), (0, 1), (0,)),
    StopCommand(4),
    Interrupt(4),
    RunCommand(5, PoolCheck(), (), ()),
    RunCommand(6, PoolClose(), (), ()),
    LaunchStop(),
    Rendezvous("::1", 29500),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_comes_back_as_it_left(message):
    seal = Seal.new()
    assert decode(encode(message, seal), type(message), seal=seal) == message


def test_tensors_and_values_come_back_inside_a_sealed_frame():
    seal = Seal.new()
    answer = PoolAnswer(1, "ok", weights={7: {"w": torch.ones(2)}}, value={"value": b"\x80"})
    back = decode(encode(NodeAnswer(0, 1, "ok", {0: answer}), seal), NodeAnswer, seal=seal)
    assert torch.equal(back.answers[0].weights[7]["w"], torch.ones(2))
    assert back.answers[0].value == {"value": b"\x80"}
    value = decode(encode(NodeValue((1, [2.0]), {0: {}}), seal), NodeValue, seal=seal)
    assert value == NodeValue((1, [2.0]), {0: {}})


class _Forged:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "a"))


def test_a_frame_sealed_with_another_secret_is_refused_before_it_is_read(tmp_path):
    marker = tmp_path / "unpickled"
    frame = encode(NodePrint(_Forged(marker)), Seal.new())  # the shape is right, the seal not
    with pytest.raises(ProtocolError, match="seal"):
        decode(frame, NodePrint, seal=Seal.new())
    assert not marker.exists()


def test_a_bare_pickle_is_refused(tmp_path):
    marker = tmp_path / "unpickled"
    with pytest.raises(ProtocolError):
        decode(pickle.dumps(_Forged(marker)), NodePrint, seal=Seal.new())
    assert not marker.exists()


def test_a_kind_not_of_this_protocol_or_not_expected_here_is_refused():
    seal = Seal.new()
    unknown = msgpack.ExtType(1, msgpack.packb(["Popen", [["sh"]]]))
    with pytest.raises(ProtocolError, match="no message kind 'Popen'"):
        decode(seal.close(msgpack.packb(unknown)), NodePrint, seal=seal)
    with pytest.raises(ProtocolError, match="expected NodePrint, got RunCommand"):
        decode(encode(RunCommand(1, PoolPull("x"), (0,), ()), seal), NodePrint, seal=seal)
    extra = msgpack.ExtType(1, msgpack.packb(["NodePrint", ["x", "a field too many"]]))
    with pytest.raises(ProtocolError, match="not a message"):
        decode(seal.close(msgpack.packb(extra)), NodePrint, seal=seal)


def test_a_cut_off_or_damaged_frame_is_refused():
    seal = Seal.new()
    frame = encode(NodePrint("a line"), seal)
    for damaged in (frame[:-1], frame[:10], b"", frame[:-1] + bytes([frame[-1] ^ 1])):
        with pytest.raises(ProtocolError):
            decode(damaged, NodePrint, seal=seal)
    cut = seal.close(
        codec.encode(NodePrint("a line"), {"NodePrint": NodePrint})[:-2]
    )  # sealed, cut
    with pytest.raises(ProtocolError, match="not a message"):
        decode(cut, NodePrint, seal=seal)


def test_a_secret_must_be_32_random_bytes():
    with pytest.raises(ValueError, match="32 random bytes"):
        Seal(b"short")
