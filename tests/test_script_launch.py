"""``notebook-kit launch`` settings: precedence, torchrun arguments, environment, bad input."""

from __future__ import annotations

import json

import pytest

from notebook_kit.cli.main import main
from notebook_kit.cli.script_launch import LaunchInputError, ScriptLaunch, plan_script_launch
from notebook_kit.config.launch_config import LaunchConfig
from notebook_kit.config.launch_plan import worker_environment

COILED = {
    "COILED_BATCH_TASK_ID": "1",
    "COILED_BATCH_TASK_COUNT": "2",
    "COILED_BATCH_SCHEDULER_ADDRESS": "10.0.0.7",
}


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTEBOOK_KIT_CONFIG", str(tmp_path / "no-saved-default.json"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def test_single_node_uses_a_free_port_and_the_notebook_environment(script):
    launch = plan_script_launch(script, ["--lr", "0.1"], {"num_processes": 2}, environ={})
    assert launch.torchrun_arguments() == [
        "--nproc-per-node", "2", "--max-restarts", "0", "--standalone",
        "-m", "notebook_kit.cli.script_entry", script, "--lr", "0.1",
    ]  # fmt: skip
    env = worker_environment(launch.config, launch.threads)
    assert env["NOTEBOOK_KIT_MIXED_PRECISION"] == "no"
    assert env["NOTEBOOK_KIT_GRADIENT_ACCUMULATION_STEPS"] == "1"
    assert int(env["OMP_NUM_THREADS"]) >= 1
    assert env["GLOO_SOCKET_IFNAME"] == "lo"


def test_multi_node_uses_the_static_rendezvous_at_node_0(script):
    given = {"num_processes": 2, "num_nodes": 2, "node_rank": 1, "master_addr": "head"}
    launch = plan_script_launch(script, (), given, environ={})
    assert launch.torchrun_arguments() == [
        "--nproc-per-node", "2", "--max-restarts", "0", "--nnodes", "2", "--node-rank", "1",
        "--master-addr", "head", "--master-port", "29500",
        "-m", "notebook_kit.cli.script_entry", script,
    ]  # fmt: skip
    env = worker_environment(launch.config, launch.threads)
    assert "GLOO_SOCKET_IFNAME" not in env


def test_restarts_keep_the_node_local_rendezvous_and_use_c10d_across_nodes(script):
    single = plan_script_launch(script, (), {"num_processes": 2, "max_restarts": 1}, environ={})
    assert "--standalone" in single.torchrun_arguments()
    given = {"num_nodes": 2, "node_rank": 1, "master_addr": "head", "max_restarts": 3}
    words = plan_script_launch(script, (), given, environ={}).torchrun_arguments()
    assert words[4:12] == [
        "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29500",
        "--rdzv-id", "notebook-kit-29500",
    ]  # fmt: skip


def test_threads_come_from_the_config_then_the_shell_then_the_cores(script, monkeypatch):
    config = {"num_processes": 2, "threads_per_process": 3}
    assert plan_script_launch(script, (), config, environ={}).threads == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert plan_script_launch(script, (), {"num_processes": 2}, environ={}).threads == 5


def test_config_file_then_scheduler_then_options(script, tmp_path):
    config = tmp_path / "run.json"
    LaunchConfig(num_processes=4, mixed_precision="bf16", num_nodes=3, master_port=4000).save(
        config
    )
    launch = plan_script_launch(script, (), {"num_processes": 2}, str(config), environ=COILED)
    assert launch.num_processes == 2  # option beats file
    assert launch.config.mixed_precision == "bf16"  # file beats built-in
    assert (launch.config.num_nodes, launch.config.node_rank) == (2, 1)  # scheduler beats file
    assert launch.config.master_addr == "10.0.0.7"
    assert launch.config.master_port == 4000
    assert "node 1 of 2 from Coiled" in launch.banner()
    # An explicit --num-nodes describes the job: the scheduler's placement is not used.
    alone = plan_script_launch(script, (), {"num_nodes": 1}, str(config), environ=COILED)
    assert (alone.config.num_nodes, alone.placement) == (1, None)


@pytest.mark.parametrize(
    ("given", "environ", "message"),
    [
        ({"num_nodes": 2, "node_rank": 2}, {}, "--node-rank: node_rank must be from 0 to"),
        ({"node_rank": 5}, COILED, r"--node-rank: .*got 5\.$"),
        ({}, {**COILED, "COILED_BATCH_TASK_COUNT": "x"}, "COILED_BATCH_TASK_COUNT='x'"),
        ({"num_nodes": 2, "master_addr": "head"}, {}, None),
        (
            {"num_nodes": 2},
            {},
            r"--master-addr: master_addr is '127\.0\.0\.1' \(from built-in defaults\), which "
            r"only this machine can reach.*--master-addr 10\.0\.0\.1",
        ),
        ({"num_nodes": 2, "master_addr": "127.0.0.1"}, {}, None),  # every node on this machine
    ],
)
def test_bad_settings_name_the_option_or_variable(script, given, environ, message):
    if message is None:  # accepted: the plan is the two-node job that was asked for
        words = plan_script_launch(script, (), given, environ=environ).torchrun_arguments()
        node = ["--nnodes", "2", "--node-rank", "0", "--master-addr", given["master_addr"]]
        assert words[4:10] == node
        return
    with pytest.raises(LaunchInputError, match=message):
        plan_script_launch(script, (), given, environ=environ)


def test_missing_script_and_config_file_are_named(script, tmp_path):
    with pytest.raises(LaunchInputError, match=r"script: no such file: nope\.py"):
        plan_script_launch("nope.py", (), {"num_processes": 1}, environ={})
    with pytest.raises(LaunchInputError, match="--config: no such file"):
        plan_script_launch(script, (), {}, str(tmp_path / "missing.json"), environ={})
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"num_proceses": 2}))
    with pytest.raises(LaunchInputError, match=r"--config: .*did you mean 'num_processes'"):
        plan_script_launch(script, (), {}, str(broken), environ={})


def test_command_line_errors_and_dry_run(script, capsys, monkeypatch):
    for name in COILED:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exited:  # argparse rejects the value itself
        main(["launch", "--num-processes", "0", script])
    assert exited.value.code == 2
    assert "argument --num-processes: num_processes must be" in capsys.readouterr().err
    assert main(["launch", "--num-nodes", "2", "--node-rank", "3", script]) == 2
    assert "--node-rank: node_rank must be from 0 to num_nodes - 1 = 1" in capsys.readouterr().err
    assert main(["launch", "--dry-run", "--num-processes", "2", script, "--x", "1"]) == 0
    out = capsys.readouterr().out
    assert "torchrun --nproc-per-node 2 --max-restarts 0 --standalone" in out
    assert out.rstrip().endswith(f"{script} --x 1")


def test_command_line_names_the_equivalent_torchrun_call():
    launch = ScriptLaunch(LaunchConfig(num_processes=2, max_restarts=1), 2, 1, "t.py", ("a b",))
    assert launch.command_line().endswith(
        "torchrun --nproc-per-node 2 --max-restarts 1 --standalone"
        " -m notebook_kit.cli.script_entry t.py 'a b'"
    )


@pytest.mark.parametrize("argv", [["launch"], ["launch", "--num-processes", "2"]])
def test_launch_without_a_script_says_what_to_type(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "required: script, script_args" not in err
    assert "notebook-kit launch: error: name the script to run" in err
    assert "notebook-kit launch --num-processes 2 train.py --epochs 3" in err
    assert "notebook-kit export" in err


def test_an_explicit_loopback_address_across_nodes_is_said_in_the_banner(script):
    launch = plan_script_launch(
        script, (), {"num_nodes": 2, "master_addr": "localhost"}, environ={}
    )
    assert "every node on this machine (master_addr localhost is loopback)" in launch.banner()
    apart = plan_script_launch(script, (), {"num_nodes": 2, "master_addr": "head"}, environ={})
    assert "every node on this machine" not in apart.banner()
