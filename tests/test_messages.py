"""Worker messages: each kind survives the trip as the pipe carries it, and decodes to its type."""

from __future__ import annotations

import msgpack
import pytest

from notebook_kit.runtime.codec import ProtocolError
from notebook_kit.runtime.messages import (
    Failure,
    Finished,
    MetricsBatch,
    PoolAnswer,
    Progress,
    Result,
    Started,
    decode,
    encode,
    weights_of,
)

EXAMPLES = (
    Started(rank=1, pid=4321),
    MetricsBatch(0, ((0, 3, {"loss": 0.5}), (0, None, {"acc": 1.0})), 2, Progress(9, 40, 10)),
    Failure("ValueError", "bad lr", "Traceback ...\nValueError: bad lr\n", 12.5),
    Finished("called sys.exit(0)", 3.25),
    Result({"accuracy": 0.9}, {140: {"weight": [1.0, 2.0]}}, "returned", 4.0),
    PoolAnswer(7, "error", failure=Failure("KeyError", "'x'", "Traceback ...", 1.0)),
    PoolAnswer(8, "ok", weights={1: {"bias": 0.0}}, value={"value": b"\x80\x05K\x01."}),
)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_kind_decodes_to_what_was_sent_as_plain_data(message) -> None:
    wire = encode(message)
    assert b"notebook_kit" not in wire  # the kernel needs none of the worker's classes
    assert 3 not in _extensions(wire)  # nothing pickled: each field is plain data
    assert decode(wire) == message


def _extensions(data: bytes) -> set[int]:
    """Every msgpack extension code in ``data``, nested ones too."""
    codes: set[int] = set()

    def hook(code: int, inner: bytes) -> None:
        codes.add(code)
        if code != 3:
            msgpack.unpackb(inner, ext_hook=hook, strict_map_key=False)

    msgpack.unpackb(data, ext_hook=hook, strict_map_key=False)
    return codes


def test_a_single_record_is_a_batch_of_one_and_a_foreign_frame_is_refused() -> None:
    batch = MetricsBatch(3, ((3, 5, {"loss": 2.0}),), dropped=None, progress=None)
    assert decode(encode(batch)) == batch
    with pytest.raises(ProtocolError):
        decode(b"something else")


def test_a_failure_keeps_the_users_frames_and_names_its_rank() -> None:
    def user_code() -> None:
        raise ValueError("bad lr")

    try:
        user_code()
    except ValueError as error:
        failure = Failure.from_exception(error, error.__traceback__, [__file__], False)
        kept = Failure.from_exception(error, error.__traceback__, [__file__])
    assert failure.exception_type == "ValueError" and failure.message == "bad lr"
    assert "user_code" not in failure.traceback  # every frame here is hidden
    assert "user_code" in kept.traceback  # ... but the raising frame can be kept
    worker_failure = kept.on_rank(3)
    assert (worker_failure.rank, worker_failure.exit_code) == (3, None)
    assert worker_failure.traceback == kept.traceback and worker_failure.time == kept.time


def test_weights_are_keyed_by_the_kernels_id_and_detached() -> None:
    import torch

    model = torch.nn.Linear(2, 1)
    other = torch.nn.Linear(2, 1)
    weights = weights_of([model, other], {id(model): 99})
    assert set(weights) == {99}
    assert torch.equal(weights[99]["weight"], model.weight) and not weights[99]["weight"].grad_fn
