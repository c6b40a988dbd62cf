"""Worker messages: each kind survives the trip as the pipe carries it, and decodes to its type."""

from __future__ import annotations

import pickle

import pytest

from notebook_kit.runtime.messages import (
    Failure,
    Finished,
    MetricsBatch,
    PoolAnswer,
    Progress,
    Result,
    Started,
    decode,
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
def test_every_kind_decodes_to_what_was_sent_through_a_pickle_of_plain_data(message) -> None:
    sent: list[tuple[str, object]] = []
    from notebook_kit.runtime import messages

    messages.send(lambda kind, payload: sent.append((kind, payload)), message)
    ((kind, payload),) = sent
    wire = pickle.dumps((kind, payload))
    assert b"notebook_kit" not in wire  # the kernel needs none of the worker's classes
    assert decode(0 if isinstance(message, MetricsBatch) else 1, *pickle.loads(wire)) == message


def test_a_single_record_is_a_batch_of_one_without_progress_or_drop_count() -> None:
    batch = decode(3, "log", {"step": 5, "values": {"loss": 2, "name": "text"}})
    assert batch == MetricsBatch(3, ((3, 5, {"loss": 2.0}),), dropped=None, progress=None)
    assert decode(0, "something else", {}) is None


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
