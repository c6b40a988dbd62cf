"""What a cluster run makes of each launch setting, checked before anything starts.

Every setting of the schema is either honoured on a cluster (it reaches every node's
launcher, or the kernel that drives the nodes) or refused before anything starts: never
dropped. The real runs that show the settings reaching the ranks are in
``tests/test_cluster_faults_integration.py``.
"""

from __future__ import annotations

import pytest

from notebook_kit.config.launch_config import LaunchConfig
from notebook_kit.config.schema import CALL_SETTINGS, SETTINGS
from notebook_kit.launch.cluster import cluster_plan
from notebook_kit.launch.cluster.cluster_plan import _settings
from notebook_kit.launch.node_process.process import node_plan
from notebook_kit.node.protocol import NodeOrder, NodeSettings, Rendezvous

# Each setting, a value other than its default, and where a cluster run honours it: "node"
# (the LaunchPlan every node's launcher resolves: the attribute that holds it), "kernel" (the
# ClusterPlan the kernel drives the nodes by), or "refused".
_ON_A_CLUSTER = {
    "num_processes": ("node", "num_processes", 2),
    "mixed_precision": ("node", "mixed_precision", "bf16"),
    "gradient_accumulation_steps": ("node", "gradient_accumulation_steps", 3),
    "backend": ("node", "backend", "gloo"),
    "seed": ("node", "seed", 7),
    "master_addr": ("refused", None, "10.1.2.3"),
    "master_port": ("refused", None, 29501),
    "num_nodes": ("kernel", "num_nodes", 2),
    "node_rank": ("refused", None, 1),
    "threads_per_process": ("node", "threads", 3),
    "live": ("kernel", "live", False),
    "max_restarts": ("kernel", "max_restarts", 2),
    "use_fsdp": ("node", "use_fsdp", True),
    "timeout": ("kernel", "timeout", 30.0),
    "rendezvous_timeout": ("node", "rendezvous_timeout", 45.0),
    "isolate": ("refused", None, True),
    "stall_seconds": ("node", "stall_seconds", 5.0),
    "min_nodes": ("kernel", "min_nodes", 1),
    "parallelism_config_dp_replicate_size": ("node", "parallelism_config_dp_replicate_size", 2),
    "parallelism_config_dp_shard_size": ("node", "parallelism_config_dp_shard_size", 2),
    "parallelism_config_tp_size": ("node", "parallelism_config_tp_size", 2),
    "parallelism_config_cp_size": ("node", "parallelism_config_cp_size", 2),
    "storage_timeout": ("node", "storage_timeout", 5),
    "memory_history": ("node", "memory_history", True),
    "start_method": ("refused", None, "template"),  # a node, started clean, always forks
    "post_mortem": ("node", "post_mortem", True),
}
# What a setting needs beside it to be valid: sharding sizes need FSDP, replicas need shards.
_ALONGSIDE = {
    "parallelism_config_dp_replicate_size": {
        "fsdp": True, "parallelism_config_dp_shard_size": 2, "num_processes": 2,
    },
    "parallelism_config_dp_shard_size": {"fsdp": True},
    "parallelism_config_cp_size": {"fsdp": True},
}  # fmt: skip
# What a node on this CPU machine refuses, naming it: its ranks would train on the CPU.
_REFUSED_ON_CPU = {
    "parallelism_config_cp_size": "needs CUDA GPUs",
    "memory_history": "needs CUDA GPUs",
}
_SCHEMA = {**SETTINGS, **CALL_SETTINGS}


def _node_plan(settings: NodeSettings) -> object:
    """The LaunchPlan node 1 of 2 resolves from the settings the kernel sends it."""
    settings = settings.with_processes(0)  # as node 0's probe on a machine without a GPU
    order = NodeOrder("run", 1, 2, "127.0.0.1", None, b"", settings, "notebook_kit/x/")
    return node_plan(order, Rendezvous("127.0.0.1", 29500))


def test_every_setting_of_the_schema_is_placed_on_a_cluster():
    unplaced = sorted(set(_SCHEMA) - set(_ON_A_CLUSTER))
    assert not unplaced, (
        f"{unplaced} must be honoured on a cluster (NODE_SETTINGS or KERNEL_KEEPS of "
        f"launch/cluster/cluster_plan.py) or refused (CLUSTER_REFUSES), and placed here"
    )
    assert set(_ON_A_CLUSTER) == set(_SCHEMA)
    placed = (
        *cluster_plan.NODE_SETTINGS,
        *cluster_plan.KERNEL_KEEPS,
        *cluster_plan.CLUSTER_REFUSES,
    )
    assert sorted(placed) == sorted(_SCHEMA)  # each in exactly one place


@pytest.mark.parametrize("name", list(_ON_A_CLUSTER))
def test_each_setting_given_to_a_cluster_launch_is_honoured_or_refused_before_start(name):
    where, attribute, value = _ON_A_CLUSTER[name]
    keyword = _SCHEMA[name].keyword
    if where == "refused":
        with pytest.raises(ValueError, match=keyword):
            _settings({keyword: value})
        return
    settings, kept = _settings({keyword: value, **_ALONGSIDE.get(name, {})})
    if where == "kernel":
        assert kept[attribute] == value
    elif name in _REFUSED_ON_CPU:
        with pytest.raises(ValueError, match=f"{keyword}={value} {_REFUSED_ON_CPU[name]}"):
            _node_plan(settings)
    else:
        assert getattr(_node_plan(settings), attribute) == value


def test_fsdp_from_a_config_or_the_environment_reaches_every_node(monkeypatch):
    settings, _ = _settings({"config": LaunchConfig(use_fsdp=True, num_processes=2)})
    assert _node_plan(settings).use_fsdp
    monkeypatch.setenv("NOTEBOOK_KIT_USE_FSDP", "yes")
    monkeypatch.setenv("NOTEBOOK_KIT_NUM_PROCESSES", "2")
    settings, _ = _settings({})  # in the kernel; a node's own environment may lack them
    monkeypatch.delenv("NOTEBOOK_KIT_USE_FSDP")
    monkeypatch.delenv("NOTEBOOK_KIT_NUM_PROCESSES")
    assert _node_plan(settings).use_fsdp


def test_num_nodes_from_a_config_is_the_node_count_and_its_default_one_node_per_host():
    assert _settings({"config": LaunchConfig(num_nodes=3)})[1]["num_nodes"] == 3
    assert _settings({})[1]["num_nodes"] is None


@pytest.mark.parametrize(
    ("variable", "text"),
    [("NOTEBOOK_KIT_MASTER_ADDR", "10.1.2.3"), ("NOTEBOOK_KIT_MASTER_PORT", "29501")],
)
def test_an_address_the_cluster_chooses_is_refused_from_the_environment_too(
    monkeypatch, variable, text
):
    monkeypatch.setenv(variable, text)
    with pytest.raises(ValueError, match=rf"from \${variable} is chosen by the cluster"):
        _settings({})
    with pytest.raises(ValueError, match=r"from config= is chosen by the cluster"):
        _settings({"config": LaunchConfig(node_rank=1, num_nodes=2)})


def test_min_nodes_beyond_num_nodes_or_below_one_is_refused_before_start():
    with pytest.raises(ValueError, match="min_nodes=3 is more than num_nodes=2"):
        _settings({"num_nodes": 2, "min_nodes": 3})
    with pytest.raises(ValueError, match="min_nodes"):
        _settings({"min_nodes": 0})
    assert _settings({"num_nodes": 3, "min_nodes": 2})[1]["min_nodes"] == 2


def test_min_nodes_without_a_cluster_is_refused_with_the_fix():
    from notebook_kit import WorkerPool, notebook_launcher

    with pytest.raises(ValueError, match="min_nodes=1 needs cluster="):
        notebook_launcher(print, num_processes=2, min_nodes=1)
    with pytest.raises(ValueError, match="a WorkerPool never restarts on fewer nodes"):
        WorkerPool(num_processes=2, min_nodes=1)


def test_a_restart_takes_the_workers_there_down_to_min_nodes():
    from notebook_kit.launch.cluster.engines.dask import choose_workers

    workers = {"tcp://a:1": {"host": "a"}, "tcp://b:1": {"host": "b"}}
    assert choose_workers(workers, 3, min_nodes=2) == ["tcp://a:1", "tcp://b:1"]
    with pytest.raises(ValueError, match="min_nodes=3 needs at least 3 Dask workers"):
        choose_workers(workers, 4, min_nodes=3)
    with pytest.raises(ValueError, match="num_nodes=3 needs 3 Dask workers"):
        choose_workers(workers, 3)


class _Cluster:
    """The engine's view of a cluster whose worker list still shows a lost worker (the
    scheduler has not noticed yet, or its network is cut): ``choose`` is the Dask engine's."""

    worker_noun = "Dask worker"
    grow_hint = "Add workers (cluster.scale(...))"

    def __init__(self, workers: list[str]) -> None:
        self.workers = workers

    def present(self) -> set[str]:
        return set(self.workers)

    def choose(self, num_nodes, min_nodes=None, exclude=frozenset()):
        from notebook_kit.launch.cluster.engines.dask import choose_workers

        listed = {address: {"host": address} for address in self.workers}
        return choose_workers(
            {a: w for a, w in listed.items() if a not in exclude}, num_nodes, min_nodes
        )


def _restart_on(cluster: _Cluster, lost: set[str], min_nodes: int) -> list[str]:
    from types import SimpleNamespace

    from notebook_kit.launch.cluster.run import _choose_again

    plan = SimpleNamespace(num_nodes=2, min_nodes=min_nodes, settings=SimpleNamespace(
        rendezvous_timeout=0.0))  # fmt: skip
    steps = _choose_again(cluster, plan, 2, lost)
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value


def test_a_restart_never_chooses_the_lost_nodes_worker_even_while_it_is_listed(capsys):
    cluster = _Cluster(["tcp://a:1", "tcp://b:1"])
    assert _restart_on(cluster, {"tcp://a:1"}, min_nodes=1) == ["tcp://b:1"]
    assert "The restart runs on 1 node (was 2)." in capsys.readouterr().out
    with pytest.raises(TimeoutError, match="min_nodes=2 Dask workers to restart, but 1 was"):
        _restart_on(cluster, {"tcp://b:1"}, min_nodes=2)


def test_a_cluster_restart_is_announced_with_the_rank_and_node_or_the_lost_node():
    from notebook_kit.errors import WorkerFailure
    from notebook_kit.launch.cluster.failures import ClusterWorkerError, node_lost

    raised = WorkerFailure(3, 1, "RuntimeError", "boom", "", 0.0)
    error = ClusterWorkerError([raised], 4, ["tcp://a:1", "tcp://b:1"])
    assert (
        error.restart_reason()
        == "Rank 3 (node 1, Dask worker tcp://b:1) failed (RuntimeError: boom)"
    )
    lost = node_lost(1, 2, "tcp://b:1", "its Dask worker left the cluster", "Dask worker")
    error = ClusterWorkerError([lost], 4, ["tcp://a:1", "tcp://b:1"], lost_nodes=(1,))
    assert error.restart_reason().startswith("node 1 lost: its Dask worker left the cluster")


def test_a_node_plans_from_its_typed_settings_and_node_0s_address():
    config = LaunchConfig(num_processes=2, max_restarts=3)
    order = NodeOrder("run", 1, 2, "10.1.2.4", None, b"", NodeSettings(config, 60, None), "p/")
    plan = node_plan(order, Rendezvous("10.1.2.3", 29501))
    assert (plan.master_addr, plan.port) == ("10.1.2.3", 29501)
    assert (plan.num_nodes, plan.node_rank, plan.max_restarts) == (2, 1, 0)


@pytest.mark.parametrize(("cell_can_type", "waits"), [(True, 7 * 24 * 3600.0), (False, None)])
def test_the_nodes_ranks_wait_in_collectives_as_long_as_the_kernels_cell_can_answer_pdb(
    monkeypatch, cell_can_type, waits
):
    """A node has no cell; the kernel's answers its ranks' pdb, so the kernel's choice goes."""
    monkeypatch.setattr("notebook_kit.launch.plan.can_type", lambda: cell_can_type)
    settings, _ = _settings({})
    monkeypatch.setattr("notebook_kit.launch.plan.can_type", lambda: not cell_can_type)
    assert _node_plan(settings).collective_timeout == waits
