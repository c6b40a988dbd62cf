"""Bad launch arguments are refused with a clear message before any process starts."""

from __future__ import annotations

import pytest

from notebook_kit import notebook_launcher
from notebook_kit.config import arguments
from notebook_kit.config.launch_config import LaunchConfig, resolve_launch_config
from notebook_kit.errors import WorkerError, WorkerFailure
from notebook_kit.launch.plan import make_plan


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        ({"num_processes": 0}, ValueError, r"num_processes must be >= 1, got 0"),
        ({"num_processes": -1}, ValueError, r"num_processes must be >= 1, got -1"),
        ({"num_processes": "two"}, TypeError, r"num_processes must be an integer"),
        ({"num_processes": 2.0}, TypeError, r"num_processes must be an integer"),
        ({"num_processes": True}, TypeError, r"num_processes must be an integer"),
        ({"mixed_precision": "fp8"}, ValueError, r"mixed_precision must be one of 'no', 'fp16'"),
        ({"num_nodes": 2, "node_rank": 2}, ValueError, r"node_rank must be in 0\.\.1"),
        ({"node_rank": -1}, ValueError, r"node_rank must be >= 0"),
        ({"num_nodes": 0}, ValueError, r"num_nodes must be >= 1"),
        ({"use_port": 70000}, ValueError, r"use_port must be >= 1 and <= 65535"),
        ({"use_port": "29500"}, TypeError, r"use_port must be an integer"),
        ({"backend": "mpi"}, ValueError, r"backend must be one of 'gloo', 'nccl'"),
        ({"backend": "nccl", "num_processes": 2}, ValueError, r"backend='nccl' needs one GPU"),
        ({"threads_per_process": 0}, ValueError, r"threads_per_process must be >= 1"),
        ({"timeout": -5}, ValueError, r"timeout must be a positive number"),
        ({"timeout": "soon"}, TypeError, r"timeout must be a number"),
        ({"master_addr": ""}, ValueError, r"master_addr must be a host name"),
        (
            {"num_nodes": 2, "node_rank": 1},
            ValueError,
            r"master_addr is '127\.0\.0\.1' \(the default\), which only this machine can reach",
        ),
        (
            {"config": LaunchConfig(num_nodes=2, master_addr="localhost")},
            ValueError,
            r"master_addr is 'localhost'.*master_addr=\"10\.0\.0\.1\".*pass master_addr=",
        ),
        ({"args": 5}, TypeError, r"args must be a tuple .* args=\(value,\)"),
        ({"args": "abc"}, TypeError, r"args must be a tuple"),
        ({"kwargs": [1]}, TypeError, r"kwargs must be a dict"),
        ({"gradient_accumulation_steps": 0}, ValueError, r"gradient_accumulation_steps must be"),
        ({"seed": "x"}, TypeError, r"seed must be an integer"),
        ({"max_restarts": -1}, ValueError, r"max_restarts must be >= 0"),
        ({"config": {"num_processes": 2}}, TypeError, r"config must be a LaunchConfig"),
        (
            {"num_nodes": 2, "config": LaunchConfig(node_rank=2, num_nodes=3)},
            ValueError,
            "node_rank",
        ),
    ],
)
def test_bad_arguments_are_refused_before_forking(tmp_path, options, error, pattern):
    marker = tmp_path / "ran"
    options = {"num_processes": 2, **options}
    with pytest.raises(error, match=pattern):
        notebook_launcher(marker.touch, **options)
    assert not marker.exists()


def test_function_must_be_callable():
    with pytest.raises(TypeError, match="function must be callable"):
        notebook_launcher("train", num_processes=2)


def test_multi_node_ranks_and_world_size():
    config = LaunchConfig(num_processes=3, num_nodes=2, node_rank=1, master_addr="10.0.0.1")
    plan = make_plan(config)
    assert plan.world_size == 6
    assert [plan.global_rank(i) for i in range(3)] == [3, 4, 5]
    assert plan.port == 29500 and plan.master_addr == "10.0.0.1"
    assert "node 1 of 2, world size 6" in plan.banner()


def test_single_node_always_uses_loopback():
    config = LaunchConfig(num_processes=2, master_addr="example.org")
    assert make_plan(config).master_addr == "127.0.0.1"


def _failure(rank: int, at: float, kind: str | None, message: str) -> WorkerFailure:
    return WorkerFailure(rank, None if kind else -9, kind, message, "", at)


def test_root_cause_skips_consequences_of_another_rank():
    consequence = _failure(0, 1.0, "RuntimeError", "[pair.cc:553] Connection closed by peer")
    cause = _failure(1, 2.0, None, "died from SIGKILL (9) without a Python exception")
    error = WorkerError([consequence, cause], world_size=2)
    assert error.rank == 1
    assert str(error).startswith("Rank 1 of 2 failed: died from SIGKILL")
    assert "Rank 0 failed afterwards" in str(error)


def test_root_cause_is_the_earliest_real_error():
    late = _failure(0, 2.0, "ValueError", "late")
    early = _failure(1, 1.0, "KeyError", "early")
    assert WorkerError([late, early], world_size=2).rank == 1


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("10.0.0.1", False),
        ("node0.cluster", False),
        ("0.0.0.0", False),
    ],
)
def test_loopback_addresses_are_recognised(address, loopback):
    assert arguments.is_loopback(address) is loopback


def test_an_explicit_loopback_address_across_nodes_is_allowed_and_said():
    settings = resolve_launch_config(num_nodes=2, master_addr="127.0.0.1")
    banner = make_plan(settings).banner()
    assert "node 0 of 2, world size 2, every node on this machine" in banner
    assert "(master_addr 127.0.0.1 is loopback)" in banner
    apart = make_plan(resolve_launch_config(num_nodes=2, master_addr="10.0.0.1")).banner()
    assert "loopback" not in apart
