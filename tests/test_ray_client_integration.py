"""A kernel outside the Ray cluster: ``notebook_launcher(cluster="ray://head:port")``.

The module starts one Ray head as a user's machine does (``ray start --head --block``, with a
Ray client server), and the test process joins it as a Ray client through the handle: a launch,
the cell run again, a pool, and what a handle that reaches no Ray client server gets. The head
needs no token (``RAY_AUTH_MODE=disabled``), so the runs do not depend on a token file that an
earlier ``ray.init`` of this process may have written.

The head runs with gRPC's fork support off (``GRPC_ENABLE_FORK_SUPPORT=false``), as importing
notebook_kit sets it for the kernel. With it on, which is grpcio's default, a process that holds
gRPC threads and forks a child to exec another has gRPC start threads in that child first, and
they sometimes crash it: the head's client-server proxy then answers "Starting Ray client
server failed". A head is the user's to start; the kernel's forks are ours, and the launch test
checks that a Ray client kernel's forked workers start no gRPC thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from notebook_kit import WorkerPool, notebook_launcher
from tests.optional import needs
from tests.processes import free_port, marked_node_processes

pytestmark = [pytest.mark.integration, needs("ray", what="runs through a Ray client")]

# Marks the environment of the head (and so of its Ray workers and their node processes), so a
# check for leftovers counts only this module's.
_MARK, _TOKEN = "NK_RAY_CLIENT_TEST_RUN", secrets.token_hex(8)
_HEAD_START_S = 120.0  # `ray start --head` takes 15 s on 2 idle cores


@pytest.fixture(scope="module")
def head():
    """A Ray head on this machine, with its GCS and its Ray client server on free ports."""
    ray_cli = Path(sys.executable).with_name("ray")
    if not ray_cli.exists():
        pytest.skip(f"no `ray` command beside {sys.executable} to start a head with")
    gcs_port, client_port = free_port(), free_port()
    # Its own temporary folder (short: Ray's socket paths must fit 107 bytes) keeps its files,
    # the file naming "the cluster on this machine" among them, from every later ray.init().
    temp_dir = tempfile.mkdtemp(prefix="nk-ray-")
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    env.update({_MARK: _TOKEN, "GRPC_ENABLE_FORK_SUPPORT": "false"})  # see the docstring
    command = [
        str(ray_cli), "start", "--head", "--block", f"--port={gcs_port}",
        f"--ray-client-server-port={client_port}", "--num-cpus=2", f"--temp-dir={temp_dir}",
        "--include-dashboard=false", "--disable-usage-stats",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + _HEAD_START_S
        while not _accepts(client_port):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                output = process.communicate()[0].decode(errors="replace")
                pytest.fail(f"the Ray head did not start: {output[-3000:]}")
            time.sleep(0.2)
        yield {"client": f"ray://127.0.0.1:{client_port}", "gcs_port": gcs_port}
    finally:
        import ray

        ray.shutdown()
        process.terminate()  # `ray start --block` stops what it started, in order
        try:
            process.wait(60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # anything of the head's left after it
            process.wait()
            process.stdout.close()
            shutil.rmtree(temp_dir, ignore_errors=True)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    except OSError:
        return False
    return True


def _node_processes() -> list[int]:
    return marked_node_processes(_MARK, _TOKEN)


def _left_on_the_head() -> dict[str, list]:
    """Node processes, placement groups not removed, runs the kernel's hub holds, and
    notebook_kit actors besides that hub and the keeper: as a Ray client sees them."""
    import ray
    from ray.util import list_named_actors, placement_group_table

    names = [a["name"] for a in list_named_actors(all_namespaces=True)]
    ours = [name for name in names if name.startswith("notebook_kit")]
    job = ray.get_runtime_context().get_job_id()
    hub = f"notebook_kit-hub-{job}"
    runs = ray.get(ray.get_actor(hub).runs.remote(), timeout=30) if hub in ours else []
    others = [n for n in ours if n != hub and not n.startswith(f"notebook_kit-keeper-{job}")]
    groups = [g for g, row in placement_group_table().items() if row["state"] != "REMOVED"]
    return {"node processes": _node_processes(), "groups": groups, "runs": runs,
            "actors": others}  # fmt: skip


def _assert_nothing_left(within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while any((left := _left_on_the_head()).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(left.values()), f"left on the Ray cluster: {left}"


def _train(model):
    from notebook_kit import Accelerator

    accelerator = Accelerator()
    model = accelerator.prepare(model)
    with torch.no_grad():
        model.module.weight.fill_(7.0)
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    return total.item()


def _thread_names():
    tasks = Path("/proc/self/task")
    return sorted((tasks / task / "comm").read_text().strip() for task in os.listdir(tasks))


def _rank():
    import torch.distributed as dist

    return dist.get_rank()


_WRONG_PORT_THEN_RIGHT = """
import json, sys
import ray
from notebook_kit import notebook_launcher

def rank():
    import torch.distributed as dist
    return dist.get_rank()

wrong, right = sys.argv[1:]
try:
    notebook_launcher(rank, cluster=wrong, num_nodes=2, num_processes=1, live=False)
    said = None
except ConnectionError as error:
    said = str(error)
joined_after_failure = ray.is_initialized()
ray.init(address="local", num_cpus=1, include_dashboard=False)  # a next cell: a local instance
local = ray.cluster_resources().get("CPU")
ray.shutdown()
value = notebook_launcher(rank, cluster=right, num_nodes=2, num_processes=1, live=False)
print(json.dumps({"said": said, "joined": joined_after_failure, "local": local, "value": value}))
"""


def test_the_heads_gcs_port_is_named_and_the_kernel_can_join_the_right_one_after(head):
    """A port that takes connections but is no Ray client server (the head's GCS port): the
    message names the client server's port. In the same process, as a user's next cells do,
    Ray then starts a local instance (Ray's failed client leaves it unable to, unless shut down)
    and the kernel joins the right head. Ray's client retries for 30 s by default; its own
    settings shorten that here."""
    env = dict(os.environ, RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S="1")
    env["RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S"] = "1"
    wrong = f"ray://127.0.0.1:{head['gcs_port']}"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WRONG_PORT_THEN_RIGHT), wrong, head["client"]],
        env=env, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    said = outcome["said"]
    assert said is not None and said.startswith(f"cluster={wrong!r}: "), said
    assert "accepts connections, but no Ray client server answered" in said
    assert "not its GCS port" in said and "RAY_AUTH_MODE=token" in said
    assert outcome["joined"] is False
    assert outcome["local"] == 1.0  # a failed connection leaves Ray able to start again
    assert outcome["value"] == 0


def test_a_ray_client_kernel_launches_runs_the_cell_again_and_keeps_a_pool(head):
    import ray

    assert not ray.is_initialized()
    handle = head["client"]
    try:
        for _ in range(2):  # the cell, and the cell run again on the client connection it made
            model = torch.nn.Linear(3, 1)
            result = notebook_launcher(
                _train, args=(model,), cluster=handle, num_nodes=2, num_processes=1, live=False
            )
            assert result == 3.0
            assert torch.equal(model.weight, torch.full_like(model.weight, 7.0))  # came home
        # A local launch from this kernel, which now holds a Ray client's gRPC threads: its
        # forked workers start none of gRPC's (they sometimes crashed a worker at its start).
        names = notebook_launcher(_thread_names, num_processes=2, live=False)
        assert "event_engine" not in names, names
        other = f"ray://127.0.0.1:{head['gcs_port']}"
        with pytest.raises(ValueError, match=r"has joined another Ray cluster already"):
            notebook_launcher(_rank, cluster=other, num_nodes=2, live=False)
        pool = WorkerPool(cluster=handle, num_nodes=2, num_processes=1, live=False)
        try:
            assert pool.run(_rank, ranks="all") == [0, 1]
            pool.push(x=41)
            assert pool.run_cell("x + 1") == 42 and pool.pull("x", rank=1) == 41
        finally:
            pool.close()
        _assert_nothing_left()
    finally:
        ray.shutdown()


def test_a_ray_client_handle_that_no_head_takes_is_refused_at_once(head):
    import ray

    assert not ray.is_initialized()
    with pytest.raises(ValueError, match=r"names no host and port: pass 'ray://HEAD:PORT'"):
        notebook_launcher(_rank, cluster="ray://127.0.0.1", num_nodes=2, live=False)
    closed = free_port()
    started = time.monotonic()
    with pytest.raises(ConnectionError) as caught:
        notebook_launcher(_rank, cluster=f"ray://127.0.0.1:{closed}", num_nodes=2, live=False)
    assert time.monotonic() - started < 10.0  # not Ray's client retrying for 30 s
    message = str(caught.value)
    assert message.startswith(f"cluster='ray://127.0.0.1:{closed}': nothing accepts connections")
    assert "ray start --head" in message and "10001" in message
    assert not ray.is_initialized()
