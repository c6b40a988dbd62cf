"""The pool's pure parts, without processes: what is sent, how output and errors read."""

from __future__ import annotations

import multiprocessing
import pickle
import sys
import threading
import time
import types

import pytest
import torch

from notebook_kit.errors import PoolRunError, WorkerFailure
from notebook_kit.launch.pool.results import STILL_RUNNING, decode_value
from notebook_kit.launch.pool.shipping import (
    SendTooLargeError,
    WorkerHoldings,
    code_names,
    stored_names,
)
from notebook_kit.launch.pool.view import GroupedText
from notebook_kit.worker.pool.interrupt import INTERRUPTED, Guard


def _kernel(code: str) -> dict:
    """A namespace like a kernel's, with ``code`` run in it as ``__main__`` cells."""
    namespace: dict = {"__name__": "__main__"}
    exec(code, namespace)
    return namespace


def test_only_what_changed_since_the_workers_got_it_is_sent() -> None:
    space = _kernel(
        "scale = 3\ndef helper(x):\n    return x * scale\ndef f(x):\n    return helper(x)"
    )
    shipping = WorkerHoldings(space)
    shipping.remember_all()  # the fork: the workers hold all of it
    assert shipping.needed({"f"}) == {}
    exec("def helper(x):\n    return x + scale", space)  # redefined in a later cell
    assert set(shipping.needed({"f"})) == {"helper"}  # found through f, which is unchanged
    space["scale"] = 4
    assert set(shipping.needed({"f"})) == {"helper", "scale"}
    shipping.remember("helper", space["helper"])
    shipping.remember("scale", space["scale"])
    assert shipping.needed({"f"}) == {}


def test_names_a_cell_defined_on_the_workers_are_never_sent() -> None:
    space = _kernel("model = 'kernel model'\nclass Net:\n    def forward(self):\n        return lr")
    shipping = WorkerHoldings(space, hidden={"In"})
    space["lr"], space["In"], space["_private"] = 0.1, [], 1
    assert set(shipping.needed({"Net", "In", "_private", "print"})) == {"Net", "lr"}
    shipping.mark_owned({"Net", "lr"})
    assert shipping.needed({"Net", "lr", "model"}) == {"model": "kernel model"}


def test_cell_names_read_and_bound() -> None:
    code = compile("import os\nx = y + 1\ndef f():\n    global z\n    z = w\ndel v", "<c>", "exec")
    assert {"y", "w"} <= code_names(code)
    assert stored_names(code) == {"os", "x", "f", "z", "v"}


def test_objects_the_workers_hold_travel_as_their_name() -> None:
    data = torch.zeros(1 << 20)  # 4 MiB
    space = _kernel("")
    space["data"] = data
    shipping = WorkerHoldings(space)
    shipping.remember_all()
    by_name = shipping.dumps({"call": (len, (data,), {})}, "pool.run")
    assert len(by_name) < 1000 and b"named" in by_name
    space["data"] = torch.zeros(1 << 20)  # rebound in the kernel: the new value is copied
    assert len(shipping.dumps({"call": (len, (space["data"],), {})}, "pool.run")) > 1 << 22


def test_a_large_array_is_refused_with_a_hint_to_push_it() -> None:
    space = _kernel("")
    space["big"] = torch.zeros(2 << 20, dtype=torch.uint8)
    shipping = WorkerHoldings(space, send_limit=1 << 20)
    with pytest.raises(SendTooLargeError) as raised:
        shipping.dumps({"shipped": {"big": space["big"]}}, "This cell")
    message = str(raised.value)
    assert message.startswith("This cell would copy `big` (torch.Tensor, 2.0 MiB)")
    assert "pool.push(big=big)" in message and "1.0 MiB" in message
    assert len(shipping.dumps({"values": {"big": space["big"]}}, "push", limit=False)) > 2 << 20


def test_kernel_functions_are_rebuilt_on_the_namespace_they_land_in() -> None:
    space = _kernel("def double(x):\n    return x * factor")
    shipping = WorkerHoldings(space)
    function = pickle.loads(shipping.dumps({"f": space["double"]}, "pool.run"))["f"]
    main = sys.modules["__main__"].__dict__  # what a worker's namespace is
    assert function.__globals__ is main and function.__name__ == "double"
    main["factor"] = 5
    try:
        assert function(2) == 10
    finally:
        del main["factor"]


def test_grouped_text_prints_each_rank_under_a_heading(capsys: pytest.CaptureFixture) -> None:
    text = GroupedText()
    text.add(1, "stdout", "b1")
    text.add(0, "stdout", "a1")
    text.add(0, "stdout", "a2")
    text.add(1, "stderr", "warning")
    text.flush()
    text.add(1, "stdout", "50%\r100%")  # a redrawn progress line shows its last state
    text.flush()
    shown = capsys.readouterr()
    assert shown.out == "[rank 0]\na1\na2\n[rank 1]\nb1\n100%\n"
    assert shown.err == "[rank 1]\nwarning\n"


def _failure(rank: int, message: str = "division by zero", when: float = 1.0) -> WorkerFailure:
    trace = f"Traceback (most recent call last):\nZeroDivisionError: {message}\n"
    return WorkerFailure(rank, None, "ZeroDivisionError", message, trace, when)


def test_the_same_error_on_every_rank_is_shown_once_as_rank_zeros() -> None:
    error = PoolRunError([_failure(1, when=0.5), _failure(0)], 2, STILL_RUNNING)
    lines = str(error).splitlines()
    assert lines[:3] == [
        "Rank 0 of 2 failed: ZeroDivisionError: division by zero",
        "Rank 1 failed the same way.",
        STILL_RUNNING,
    ]
    assert error.rank == 0 and "Traceback of rank 0:" in str(error)
    different = PoolRunError([_failure(1, "boom"), _failure(0, "other", 2.0)], 2, "stopped")
    assert str(different).splitlines()[:3] == [
        "Rank 1 of 2 failed: ZeroDivisionError: boom",
        "Rank 0 failed too: ZeroDivisionError: other",
        "stopped",
    ]


def test_values_that_cannot_come_back_say_why() -> None:
    assert decode_value({"value": pickle.dumps([1, 2])}, 0, for_display=False) == [1, 2]
    shown = {"repr": "<lock>", "unpicklable": "TypeError: cannot pickle"}
    assert repr(decode_value(shown, 0, for_display=True)) == "<lock>"
    with pytest.raises(TypeError, match="Rank 1's value cannot be pickled back"):
        decode_value(shown, 1, for_display=False)


def test_guard_interrupts_only_the_command_it_is_asked_to() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    results: list[tuple[str, object]] = []

    def busy() -> str:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            pass
        return "done"

    def serve() -> None:
        guard = Guard(reader)
        guard.watch()
        results.append(guard.run(1, busy))  # interrupted: the request names command 1
        results.append(guard.run(2, busy))  # a late request for command 1 changes nothing

    thread = threading.Thread(target=serve)
    thread.start()
    time.sleep(0.1)
    writer.send_bytes((1).to_bytes(8, "little"))
    time.sleep(0.1)
    writer.send_bytes((1).to_bytes(8, "little"))
    thread.join(10)
    writer.close()
    assert results == [(INTERRUPTED, None), ("ok", "done")]


def test_code_names_reads_nested_functions() -> None:
    code = compile("def f():\n    def g():\n        return deep\n    return g", "<c>", "exec")
    assert "deep" in code_names(code)
    assert isinstance(code, types.CodeType)


def _members(protocol: type) -> set[str]:
    """A protocol's declared members: its annotations and what its body defines."""
    own = set(vars(protocol)) | set(getattr(protocol, "__annotations__", {}))
    return {name for name in own if not name.startswith("_")}


def test_both_pool_backends_have_every_member_of_the_backend_protocol() -> None:
    from notebook_kit.launch.cluster.pool import ClusterNodes
    from notebook_kit.launch.pool.backend import PoolBackend
    from notebook_kit.launch.pool.workers import PoolProcesses

    members = _members(PoolBackend)
    assert {"start", "execute", "error", "restarts_after_fault", "world_size"} <= members
    for backend in (PoolProcesses, ClusterNodes):
        missing = {m for m in members if not hasattr(backend, m) and m not in _members(backend)}
        assert not missing, f"{backend.__name__} lacks {sorted(missing)}"


def test_every_pool_command_crosses_a_workers_pipe_as_it_left() -> None:
    from notebook_kit.runtime import pool_commands as pc

    commands = (
        pc.PoolCell("x = 1", "<cell 1>", b"\x80shipped"),
        pc.PoolCall(b"\x80call", 7),
        pc.PoolPush(b"\x80values"),
        pc.PoolPull("model"),
        pc.PoolCheck(),
        pc.PoolClose(),
    )
    for command in commands:
        request = pc.PoolRequest(3, True, command)
        assert pc.decode(pc.encode(request)) == request


def test_a_failed_command_says_in_a_field_whether_the_pool_kept_stopped_or_closed_its_workers():
    from notebook_kit.errors import PoolFate
    from notebook_kit.launch.pool.backend import RunOutcome, WorkersStopped
    from notebook_kit.launch.pool.results import raise_for
    from notebook_kit.runtime.messages import Failure, PoolAnswer

    class Backend:
        stopped_words = "gone"

        def __init__(self, restarts: bool) -> None:
            self.restarts_after_fault = restarts

        def error(self, failures: list, aftermath: str, pool: PoolFate) -> PoolRunError:
            return PoolRunError(failures, 2, aftermath, pool)

    failure = Failure("ValueError", "bad", "Traceback ...\nValueError: bad\n")
    failed = RunOutcome({0: PoolAnswer(1, "error", failure=failure), 1: PoolAnswer(1, "ok")})
    with pytest.raises(PoolRunError) as kept:
        raise_for(failed, None, None, Backend(restarts=True))  # type: ignore[arg-type]
    assert kept.value.pool == "running" and kept.value.aftermath == STILL_RUNNING
    stopped = WorkersStopped("rank 1 died", [])
    for restarts, fate in ((True, "stopped"), (False, "closed")):
        with pytest.raises(PoolRunError) as caught:
            raise_for(failed, stopped, None, Backend(restarts))  # type: ignore[arg-type]
        assert caught.value.pool == fate, restarts
        assert "The workers were stopped: rank 1 died. gone" in str(caught.value)
