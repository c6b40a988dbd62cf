"""``ParallelismConfig`` without processes: Accelerate's rules, the mesh layout, the refusals.

Each refusal is checked for the words a user needs: the sizes, the world size, the fix.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from notebook_kit import LaunchConfig, ParallelismConfig
from notebook_kit.accelerator.parallelism_config import adopt_parallelism
from notebook_kit.accelerator.strategies.parallel import check_context_parallel_device
from notebook_kit.accelerator.strategies.tensor_parallel import expand_plan
from notebook_kit.config.launch_plan import LOOPBACK, LaunchPlan, worker_environment
from notebook_kit.config.mesh_layout import MeshLayout, check_mesh_fits
from notebook_kit.errors import WorkerError, WorkerFailure
from notebook_kit.launch.cluster.cluster_plan import check_cluster_mesh
from notebook_kit.launch.plan import parallelism_sizes
from notebook_kit.node.protocol import NodeSettings, ProbeReport
from notebook_kit.runtime.messages import Failure, decode, encode

SIZE_VARIABLES = [
    f"{prefix}PARALLELISM_CONFIG_{dim}_SIZE"
    for prefix in ("NOTEBOOK_KIT_", "")
    for dim in ("DP_REPLICATE", "DP_SHARD", "TP", "CP")
]


@pytest.fixture(autouse=True)
def no_size_variables(monkeypatch):
    for name in SIZE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_the_layout_is_row_major_with_tp_innermost_and_names_the_flattened_dims():
    layout = MeshLayout.of({"dp_replicate": 2, "dp_shard": 2, "tp": 2})
    assert layout.names == ("dp_replicate", "dp_shard", "tp")
    assert layout.coordinates(5) == {"dp_replicate": 1, "dp_shard": 0, "tp": 1}
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("dp_shard") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("dp_replicate") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert layout.all_names() == ["dp_replicate", "dp_shard", "tp", "dp", "dp_shard_cp", "dp_cp"]
    assert layout.where(5) == "dp_replicate=1, dp_shard=0, tp=1"
    with pytest.raises(KeyError, match="no dimension 'cp'"):
        layout.groups("cp")


def test_sizes_that_do_not_multiply_to_the_world_size_are_refused_naming_each():
    layout = MeshLayout.of({"dp_replicate": 2, "dp_shard": 3})
    with pytest.raises(ValueError) as caught:
        check_mesh_fits(layout, processes_per_node=2, num_nodes=2)
    message = str(caught.value)
    for part in ("dp_replicate_size=2", "dp_shard_size=3", "cp_size=1", "tp_size=1"):
        assert part in message
    assert "world size 4" in message


def test_hsdp_across_nodes_keeps_each_shard_group_on_one_node():
    check_mesh_fits(MeshLayout.of({"dp_replicate": 2, "dp_shard": 2}), 2, 2)
    check_mesh_fits(MeshLayout.of({"dp_shard": 4}), 2, 2)  # FSDP over both nodes: asked for
    with pytest.raises(ValueError, match="would span nodes") as caught:
        check_mesh_fits(MeshLayout.of({"dp_replicate": 2, "dp_shard": 4}), 2, 4)
    assert "dp_shard_size=2, dp_replicate_size=4" in str(caught.value)


def test_accelerates_rules_hold_when_the_config_is_made():
    assert ParallelismConfig().total_size == 1
    hsdp = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
    assert hsdp.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert hsdp.dp_dim_names == ["dp_replicate", "dp_shard"]
    with pytest.raises(ValueError, match="use DDP"):
        ParallelismConfig(dp_replicate_size=2)
    with pytest.raises(ValueError, match="composes DDP with TP"):
        ParallelismConfig(dp_replicate_size=2, tp_size=2)
    with pytest.raises(ValueError, match="DeepSpeed"):
        ParallelismConfig(sp_size=2)
    with pytest.raises(ValueError, match="tp_size must be an integer >= 1"):
        ParallelismConfig(tp_size=0)
    with pytest.raises(ValueError, match="cp_backend"):
        ParallelismConfig(cp_backend="ring")  # type: ignore[arg-type]


def test_the_accelerator_refuses_what_the_world_and_fsdp_cannot_hold():
    with pytest.raises(ValueError) as caught:
        ParallelismConfig(dp_shard_size=2, tp_size=2).check_world(6, fsdp=True)
    assert "multiplies to 4" in str(caught.value) and "world size is 6" in str(caught.value)
    with pytest.raises(ValueError, match=r"context parallelism .* needs FSDP2"):
        ParallelismConfig(cp_size=2).check_world(2, fsdp=False)
    with pytest.raises(ValueError, match="dp_shard_size > 1 needs FSDP2"):
        ParallelismConfig(dp_shard_size=2).check_world(2, fsdp=False)
    with pytest.raises(ValueError, match="nothing to shard over"):
        ParallelismConfig(tp_size=2).check_world(2, fsdp=True)
    ParallelismConfig(tp_size=2).check_world(2, fsdp=False)


def test_context_parallel_on_cpu_is_refused_saying_what_it_needs():
    with pytest.raises(ValueError, match="needs CUDA GPUs") as caught:
        check_context_parallel_device(torch.device("cpu"), 2)
    assert "cp_size=1" in str(caught.value)
    check_context_parallel_device(torch.device("cpu"), 1)


def test_sizes_left_out_come_from_the_launch_then_from_accelerates_variables(monkeypatch):
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "4")
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "3")
    monkeypatch.setenv("NOTEBOOK_KIT_PARALLELISM_CONFIG_TP_SIZE", "2")
    config = ParallelismConfig()
    assert (config.tp_size, config.dp_shard_size, config.dp_replicate_size) == (2, 3, 1)
    assert ParallelismConfig(tp_size=1).tp_size == 1  # given beats both
    monkeypatch.setenv("NOTEBOOK_KIT_PARALLELISM_CONFIG_CP_SIZE", "two")
    with pytest.raises(ValueError, match="NOTEBOOK_KIT_PARALLELISM_CONFIG_CP_SIZE"):
        ParallelismConfig()


def test_accelerates_own_config_and_handlers_are_taken_field_by_field():
    from accelerate.parallelism_config import ParallelismConfig as Theirs
    from accelerate.utils import TorchContextParallelConfig

    theirs = Theirs(
        dp_shard_size=2,
        tp_size=2,
        cp_size=2,
        cp_handler=TorchContextParallelConfig(cp_comm_strategy="alltoall"),
    )
    ours = adopt_parallelism(theirs)
    assert isinstance(ours, ParallelismConfig)
    assert (ours.dp_shard_size, ours.tp_size, ours.cp_size) == (2, 2, 2)
    assert ours.cp_handler.cp_comm_strategy == "alltoall"
    assert type(ours.tp_handler).__module__.startswith("notebook_kit")
    with pytest.raises(TypeError, match="parallelism_config must be a ParallelismConfig"):
        adopt_parallelism({"tp_size": 2})


def test_a_plan_with_stars_names_each_module_and_its_parameters():
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Linear(2, 2)))
    assert list(expand_plan(model, {"*.0": "colwise"})) == [
        "0.0.weight", "0.0.bias", "0.0", "1.0.weight", "1.0.bias", "1.0",
    ]  # fmt: skip


def test_the_launch_settings_are_checked_before_anything_starts():
    config = LaunchConfig(parallelism_config_dp_shard_size=2, parallelism_config_tp_size=2)
    with pytest.raises(ValueError, match="add fsdp=True"):
        parallelism_sizes(config, 4)
    with pytest.raises(ValueError, match="world size 2"):
        parallelism_sizes(config.replace(use_fsdp=True), 2)
    sizes = parallelism_sizes(config.replace(use_fsdp=True), 4)
    assert dict(sizes) == {"dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}
    hsdp = LaunchConfig(
        num_nodes=4,
        use_fsdp=True,
        parallelism_config_dp_replicate_size=2,
        parallelism_config_dp_shard_size=4,
    )
    with pytest.raises(ValueError, match="would span nodes"):
        parallelism_sizes(hsdp, 2)
    assert parallelism_sizes(LaunchConfig(), 2) == ()


def test_the_banner_and_a_script_launch_carry_the_mesh():
    plan = LaunchPlan(
        4, 1, 0, LOOPBACK, None, "gloo", 1, "no", 1, 300.0, None,
        parallelism_config_dp_replicate_size=2, parallelism_config_dp_shard_size=2,
    )  # fmt: skip
    banner = plan.banner()
    assert "Mesh dp_replicate 2 × dp_shard 2" in banner
    assert "dp_shard groups [0 1] [2 3]" in banner and "dp_replicate groups [0 2] [1 3]" in banner
    config = LaunchConfig(use_fsdp=True, parallelism_config_dp_shard_size=2)
    environment = worker_environment(config, 1)
    assert environment["NOTEBOOK_KIT_PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2"
    assert environment["NOTEBOOK_KIT_PARALLELISM_CONFIG_TP_SIZE"] == "1"


def test_a_failure_names_the_ranks_mesh_coordinates():
    sent = Failure("ValueError", "boom", "Traceback ...", 1.0, mesh="dp_replicate=1, dp_shard=0")
    failure = decode(encode(sent)).on_rank(2)
    assert failure.mesh == "dp_replicate=1, dp_shard=0"
    message = str(WorkerError([failure], 4))
    assert message.startswith("Rank 2 of 4 (mesh coordinates dp_replicate=1, dp_shard=0) failed")
    plain = WorkerFailure(1, None, "ValueError", "boom", "", 1.0)
    assert str(WorkerError([plain], 2)).startswith("Rank 1 of 2 failed")


def test_the_environment_report_shows_the_mesh_the_settings_ask_for(monkeypatch):
    from notebook_kit import environment

    assert "Mesh          none" in environment().to_text()
    monkeypatch.setenv("NOTEBOOK_KIT_PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    monkeypatch.setenv("NOTEBOOK_KIT_PARALLELISM_CONFIG_TP_SIZE", "2")
    text = environment().to_text()
    assert "Mesh dp_shard 2 × tp 2: dp_shard groups [0 2] [1 3]; tp groups [0 1] [2 3]" in text
    assert "needs a world size of 4" in text


def test_the_launch_refuses_replicas_alone_and_context_parallel_on_cpu_ranks():
    replicas = LaunchConfig(parallelism_config_dp_replicate_size=2)
    with pytest.raises(ValueError, match="plain data parallel") as caught:
        parallelism_sizes(replicas, 2)
    assert "parallelism_config_dp_replicate_size=2" in str(caught.value)
    with pytest.raises(ValueError, match="DDP composed with TP"):
        parallelism_sizes(replicas.replace(parallelism_config_tp_size=2), 4)
    context = LaunchConfig(use_fsdp=True, parallelism_config_cp_size=2)
    with pytest.raises(ValueError, match=r"cp_size=2 needs CUDA GPUs.*on the CPU"):
        parallelism_sizes(context, 2, device="cpu")
    assert dict(parallelism_sizes(context, 2, device="cuda"))["cp"] == 2
    assert dict(parallelism_sizes(context, 2))["cp"] == 2  # a device not known yet: the ranks'


def _probed(gpus: int) -> ProbeReport:
    return ProbeReport("tcp://w:1", "w", "w", "3.11", "2", "1", gpus, "lo", "127.0.0.1", None)


def test_a_cluster_mesh_is_checked_on_the_probed_nodes_and_their_gpus():
    config = LaunchConfig(use_fsdp=True, num_processes=2, parallelism_config_cp_size=4)
    settings = NodeSettings(config, 300.0, None)
    check_cluster_mesh(settings, [_probed(2), _probed(2)])  # 2 GPU ranks on each of 2 nodes
    with pytest.raises(ValueError, match="needs CUDA GPUs"):
        check_cluster_mesh(settings, [_probed(2), _probed(1)])  # node 1's ranks: on the CPU
    with pytest.raises(ValueError, match=r"world size 6 \(3 node\(s\)"):
        check_cluster_mesh(settings, [_probed(2)] * 3)
