"""What a cluster run checks before anything starts: no cluster, no worker and no rank needed."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import cloudpickle
import pytest

from notebook_kit import LaunchConfig, notebook_launcher
from notebook_kit.config.environment import usable_cpu_count
from notebook_kit.launch.cluster.attempt import nodes_per_host
from notebook_kit.launch.cluster.cluster_plan import _settings
from notebook_kit.launch.cluster.code_shipping import pickle_recording_modules
from notebook_kit.launch.cluster.engine import Engine
from notebook_kit.launch.cluster.engines.dask import DaskEngine, choose_workers, dask_client
from notebook_kit.launch.cluster.probing import ClusterSetupError, check_reports
from notebook_kit.launch.cluster.run import _payload
from notebook_kit.launch.node_process.process import node_threads
from notebook_kit.launch.pool.shipping import SendTooLargeError
from notebook_kit.node.probe import interface_for, probe_version, worker_python_path
from notebook_kit.node.protocol import NodeOrder, NodeSettings, ProbeReport

_DASK = (DaskEngine.worker_noun, DaskEngine.ship_hint)


def _report(**changes) -> ProbeReport:
    here = ProbeReport(
        worker="tcp://10.0.0.2:4000",
        host="10.0.0.2",
        hostname="gpu-7",
        python=".".join(map(str, sys.version_info[:3])),
        torch=probe_version("torch"),
        notebook_kit=probe_version("notebook_kit"),
        gpus=0,
        interface="eth0",
        local_address="10.0.0.2",
        rebuild_error=None,
    )
    return replace(here, **changes)


def test_without_dask_cluster_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(ImportError, match=r"pip install 'notebook_kit\[cluster\]'"):
        notebook_launcher(print, cluster=object(), num_processes=1)


def test_a_cluster_that_is_not_one_is_named():
    pytest.importorskip("distributed")
    with pytest.raises(TypeError, match=r"cluster must be a distributed\.Client .* got str"):
        dask_client("tcp://scheduler:8786")


@pytest.mark.parametrize("name", ["use_port", "master_addr", "node_rank"])
def test_what_the_cluster_chooses_cannot_be_given(name):
    with pytest.raises(ValueError, match=f"{name} is chosen by the cluster"):
        _settings({name: 1 if name != "master_addr" else "10.0.0.1"})


def test_bad_settings_are_refused_before_any_worker_is_asked():
    with pytest.raises(ValueError, match="num_processes"):
        _settings({"num_processes": 0})
    with pytest.raises(ValueError, match="num_nodes"):
        _settings({"num_nodes": 0})


def test_one_worker_per_host_unless_num_nodes_asks_for_more():
    workers = {
        "tcp://a:2": {"host": "a"},
        "tcp://a:1": {"host": "a"},
        "tcp://b:1": {"host": "b"},
    }
    assert choose_workers(workers, None) == ["tcp://a:1", "tcp://b:1"]
    assert choose_workers(workers, 3) == ["tcp://a:1", "tcp://b:1", "tcp://a:2"]
    with pytest.raises(ValueError, match=r"num_nodes=4 needs 4 Dask workers .* has 3"):
        choose_workers(workers, 4)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"torch": "2.0.0"}, r"has torch 2.0.0, the kernel .* install torch=="),
        ({"notebook_kit": "0.0.1"}, "has notebook_kit 0.0.1"),
        ({"rebuild_error": "ModuleNotFoundError: No module named 'mylib'"}, "cannot be rebuilt"),
        ({"interface": None}, "no network interface that reaches node 0"),
    ],
)
def test_a_worker_that_differs_is_named_with_the_fix(changes, message):
    reports = [_report(), _report(worker="tcp://10.0.0.3:4000", **changes)]
    with pytest.raises(ClusterSetupError, match=message) as caught:
        check_reports(reports, *_DASK)
    assert "node 1 (Dask worker tcp://10.0.0.3:4000, host gpu-7)" in str(caught.value)


def test_matching_workers_pass():
    check_reports([_report(), _report(worker="tcp://10.0.0.3:4000")], *_DASK)


def test_the_interface_to_loopback_is_found_without_resolving_the_host_name():
    name, address = interface_for("127.0.0.1")
    assert address == "127.0.0.1" and name == "lo"


def test_a_node_process_gets_the_workers_own_folders_and_not_the_standard_library(
    monkeypatch, tmp_path
):
    import sysconfig

    monkeypatch.syspath_prepend(str(tmp_path))  # as a worker's local directory is added
    entries = worker_python_path("/opt/inherited").split(os.pathsep)
    assert entries[0] == str(tmp_path) and entries[-1] == "/opt/inherited"
    assert sysconfig.get_paths()["stdlib"] not in entries
    assert sysconfig.get_paths()["purelib"] not in entries


def test_the_interface_to_an_ipv6_node_0_is_found():
    assert interface_for("::1") == ("lo", "::1")


def test_a_module_the_nodes_cannot_import_is_named_with_how_to_send_or_install_it():
    missing = "ModuleNotFoundError: No module named 'mylib.native'"
    with pytest.raises(ClusterSetupError) as caught:
        check_reports(
            [_report(), _report(worker="tcp://10.0.0.3:4000", rebuild_error=missing)], *_DASK
        )
    message = str(caught.value)
    assert "node process cannot import module 'mylib.native'" in message
    assert "Install 'mylib' on every worker" in message
    assert "client.upload_file(path)" in message and "UploadDirectory" in message


def test_the_modules_a_payload_refers_to_by_name_are_recorded_and_can_go_by_value():
    import types

    module = types.ModuleType("nk_checks_by_value")
    exec("def double(x):\n    return 2 * x\n", module.__dict__)
    module.double.__module__ = module.__name__
    sys.modules[module.__name__] = module
    try:
        by_name, referenced = pickle_recording_modules((module.double, 1))
        assert referenced == {"nk_checks_by_value"}
        by_value, referenced = pickle_recording_modules((module.double, 1), {module.__name__})
        assert "nk_checks_by_value" not in referenced
        del sys.modules[module.__name__]
        assert cloudpickle.loads(by_value)[0](2) == 4  # rebuilt without the module
        with pytest.raises(ModuleNotFoundError):
            cloudpickle.loads(by_name)
    finally:
        sys.modules.pop(module.__name__, None)
    assert not cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES  # registered for one pickle


def test_a_payload_over_the_pools_limit_is_refused(monkeypatch):
    monkeypatch.setattr("notebook_kit.launch.cluster.run.DEFAULT_SEND_LIMIT", 1000)
    with pytest.raises(SendTooLargeError, match="more than"):
        _payload((print, (b"x" * 2000,), {}), [])


def _order(host_nodes: int, **settings) -> NodeOrder:
    config = LaunchConfig(**{"num_processes": 1, **settings})
    return NodeOrder(
        "run", 0, 3, "10.0.0.2", "eth0", b"", NodeSettings(config, 60.0, None), "p/",
        host_nodes=host_nodes,
    )  # fmt: skip


def test_nodes_that_share_a_host_share_its_cores_as_ranks_of_one_launch_would():
    reports = [_report(), _report(worker="tcp://10.0.0.2:4001"), _report(host="10.0.0.3")]
    assert nodes_per_host(reports) == [2, 2, 1]
    cores = usable_cpu_count()
    assert node_threads(_order(1)) == cores
    assert node_threads(_order(2)) == max(1, cores // 2)
    assert node_threads(_order(2, num_processes=2)) == max(1, cores // 4)
    assert node_threads(_order(2, threads_per_process=3)) == 3  # given: it wins


def test_a_node_process_starts_without_what_the_nanny_tuned_for_its_worker(monkeypatch):
    pytest.importorskip("distributed")
    from notebook_kit.node.probe import node_environment

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # as the nanny sets it
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    env = node_environment("eth0")
    assert "MALLOC_TRIM_THRESHOLD_" not in env and "OMP_NUM_THREADS" not in env
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")  # the user's own value stays
    assert node_environment(None)["MALLOC_TRIM_THRESHOLD_"] == "1048576"


def test_a_process_that_never_imported_distributed_strips_the_nannys_settings_too():
    """A Ray worker's node: a kernel that made a ``LocalCluster`` before starting Ray passed
    the nanny's settings to every Ray process, which has not imported ``distributed``."""
    pytest.importorskip("distributed")
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from notebook_kit.node.probe import node_environment\n"
        "env = node_environment(None)\n"
        "print(env.get('MALLOC_TRIM_THRESHOLD_'), env.get('OMP_NUM_THREADS'),"
        " 'distributed' in sys.modules)\n"
    )
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    shown = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert shown.stdout.split() == ["None", "None", "False"]


def test_an_engine_chooses_among_its_workers_in_its_own_words():
    class _Listed(Engine):
        worker_noun, ship_hint, grow_hint = "Thing worker", "", "Add things"

        def workers(self) -> dict[str, dict[str, str]]:
            return {"w1": {"host": "a"}, "w2": {"host": "b"}, "w3": {"host": "c"}}

    engine = _Listed()
    assert engine.present() == {"w1", "w2", "w3"}
    assert engine.choose(2, exclude={"w1"}) == ["w2", "w3"]
    with pytest.raises(
        ValueError, match=r"num_nodes=3 needs 3 Thing workers .* has 2\. Add things"
    ):
        engine.choose(3, exclude={"w2"})
