"""``breakpoint()`` on a rank of a cluster node, typed at in a real kernel's cell.

A Dask ``LocalCluster`` of two worker processes (made here, so what is left under its workers
can be counted), one rank on each node: rank 1 runs on node 1, whose node process has no cell
or terminal. Its prompt goes home as a node event; the kernel asks it with ``input()`` (each
``input_request`` answered as a frontend does, ``allow_stdin=True``) and sends the line back
to the node on the run's command topic.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from notebook_kit.launch.cluster.attempt import NODE_SILENCE_SECONDS
from notebook_kit.node.protocol import LEASE_SECONDS
from tests.kernel_cells import real_kernel
from tests.optional import needs
from tests.test_cluster_integration import assert_nothing_left, local_cluster
from tests.test_debugger_kernel_integration import EVERY_RANK, LAUNCH, RANK_1, Cell, _run

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    needs("distributed", what="cluster runs"),
]

CONNECT = "from distributed import Client\nclient = Client({address!r})\nclient.wait_for_workers(2)"
ON_NODES = ", cluster=client, num_nodes=2, num_processes=1, live=False"
NEXT_LAUNCH = (
    "print('next', notebook_launcher(lambda: 7, cluster=client, num_nodes=2, num_processes=1, "
    "live=False))"
)


@pytest.fixture(scope="module")
def cluster() -> Any:
    with local_cluster() as client:
        yield client


@pytest.fixture(scope="module")
def kernel_and_manager(cluster: Any) -> Any:
    """One kernel for the module, connected to the cluster (starting one costs seconds)."""
    with real_kernel() as (manager, client):
        connected = _run(client, CONNECT.format(address=cluster.scheduler.address))
        assert connected.error is None, connected
        yield manager, client


@pytest.fixture
def kernel(kernel_and_manager: Any) -> Any:
    return kernel_and_manager[1]


def _launch(options: str = "", stop: str = RANK_1) -> str:
    return LAUNCH.format(stop=stop, options=ON_NODES + options).replace(
        "num_processes=2, cluster", "cluster"
    )


def test_p_prints_rank_1s_variable_on_its_node_and_c_ends_the_run_normally(cluster, kernel):
    lines = iter(["p secret", "p x", "c"])
    past = max(LEASE_SECONDS, NODE_SILENCE_SECONDS) + 2.0

    def slowly(prompt: str, cell: Cell) -> str:
        # At the first prompt past the kernel's lease and a node's silence: the kernel's loop
        # waits in input(), the lease thread and the nodes' heartbeats go on.
        time.sleep(past if cell.prompts == [prompt] else 1.0)
        return next(lines)

    cell = _run(kernel, _launch(", timeout=8, stall_seconds=1"), slowly, timeout=180)
    assert cell.error is None, cell.error  # nor the launch's timeout, nor a lost node
    assert cell.prompts == ["(Pdb rank 1) "] * 3, cell.text
    assert "\n41\n" in cell.text, cell.text  # rank 1's own variable, on node 1
    assert "tensor([11.])" in cell.text, cell.text
    assert "result 21.0" in cell.text, cell.text  # rank 0 on node 0 met it in all_reduce
    # Each node reports its own ranks: node 1's rank is at the prompt, not stuck; node 0's
    # report, shown in the kernel, names it too, as the rank its own rank waits for.
    reports = cell.text.split("No rank has made progress")[1:]
    assert len(reports) >= 2, cell.text
    assert all("rank 1 is in the debugger" in report for report in reports), cell.text
    assert "rank 1: waiting" not in cell.text, cell.text
    assert_nothing_left(cluster)


def test_q_on_a_node_ends_the_run_as_rank_1s_failure_and_the_next_launch_works(cluster, kernel):
    # Its own bound, under the breakage checker's per-test one: a line lost on its way hangs.
    cell = _run(kernel, _launch(), lambda prompt, cell: "q", timeout=60)
    assert cell.error is not None and cell.error["ename"] == "ClusterWorkerError", cell
    assert "rank 1" in cell.error["evalue"], cell.error["evalue"]
    assert "quit the debugger" in cell.error["evalue"], cell.error["evalue"]
    assert_nothing_left(cluster)
    after = _run(kernel, NEXT_LAUNCH, timeout=120)
    assert after.error is None and "next 7" in after.text, after
    assert_nothing_left(cluster)


def test_two_nodes_ranks_at_a_breakpoint_take_the_cells_prompt_one_after_the_other(cluster, kernel):
    def answer(prompt: str, cell: Cell) -> str:
        return "c" if len(cell.prompts) % 2 == 0 else "p secret"

    cell = _run(kernel, _launch(stop=EVERY_RANK), answer, timeout=60)
    assert cell.error is None, cell.error
    first, second = cell.prompts[0], cell.prompts[2]
    assert {first, second} == {"(Pdb rank 0) ", "(Pdb rank 1) "}, cell.prompts
    assert cell.prompts == [first, first, second, second]  # one rank at a time, to its end
    waiting = second.removeprefix("(Pdb ").removesuffix(") ")
    assert f"{waiting} is also at a breakpoint, next" in cell.text, cell.text
    assert "\n40\n" in cell.text and "\n41\n" in cell.text and "result 21.0" in cell.text
    assert_nothing_left(cluster)


def test_an_interrupt_at_a_nodes_prompt_ends_the_run_and_leaves_nothing_on_the_cluster(
    cluster, kernel_and_manager
):
    manager, client = kernel_and_manager

    def interrupt(prompt: str, cell: Cell) -> None:
        manager.interrupt_kernel()  # SIGINT to the kernel's process group, as Jupyter does

    cell = _run(client, _launch(), interrupt, timeout=60)
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt", cell
    assert_nothing_left(cluster)
    after = _run(client, NEXT_LAUNCH, timeout=60)
    assert after.error is None and "next 7" in after.text, after


POOL = """\
from notebook_kit import WorkerPool
pool = WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False)

def step():
    import torch, torch.distributed as dist
    x = torch.tensor([float(dist.get_rank())])
    if dist.get_rank() == 1:
        breakpoint()
    dist.all_reduce(x)
    return float(x)
"""


def test_a_cluster_pool_command_opens_pdb_on_rank_1s_node_and_q_fails_the_command(cluster, kernel):
    assert _run(kernel, POOL, timeout=120).error is None
    answers = iter(["p x", "c"])
    cell = _run(kernel, "print('got', pool.run(step))", lambda p, c: next(answers), timeout=120)
    assert cell.error is None, cell
    assert cell.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "], cell.text
    assert "tensor([1.])" in cell.text and "got 1.0" in cell.text, cell.text
    quit_cell = _run(kernel, "pool.run(step)", lambda p, c: "q", timeout=120)
    assert quit_cell.error is not None, quit_cell
    assert "rank 1" in quit_cell.error["evalue"], quit_cell.error
    assert "quit the debugger" in quit_cell.error["evalue"], quit_cell.error
    assert _run(kernel, "pool.close()", timeout=60).error is None
    assert_nothing_left(cluster)


POST_MORTEM = """\
from notebook_kit import notebook_launcher

def broken():
    import torch.distributed as dist
    rank = dist.get_rank()
    doomed = 100 + rank
    if rank == 1:
        raise ValueError("rank 1 broke")
    dist.barrier()  # rank 0 waits here while rank 1 is at its post-mortem
    return rank

print("result", notebook_launcher(broken, post_mortem=True{options}))
"""


POST_MORTEM_POOL = """\
from notebook_kit import WorkerPool
pm = WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False, post_mortem=True)
"""


def test_post_mortem_opens_pdb_in_the_failing_frame_of_a_nodes_rank_and_q_ends_the_run(
    cluster, kernel
):
    answers = iter(["p doomed", "q"])
    cell = _run(kernel, POST_MORTEM.format(options=ON_NODES), lambda p, c: next(answers))
    assert cell.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "], (cell.text, cell.error)
    assert "\n101\n" in cell.text, cell.text  # rank 1's local, in the frame that raised
    assert cell.error is not None and cell.error["ename"] == "ClusterWorkerError", cell
    assert "rank 1" in cell.error["evalue"] and "rank 1 broke" in cell.error["evalue"], cell.error
    assert_nothing_left(cluster)
    # A cluster pool's command opens it the same way, before the kernel hears of the failure.
    made = _run(kernel, POST_MORTEM_POOL, timeout=120)
    assert made.error is None, made
    answers = iter(["p doomed", "c"])
    failed = _run(kernel, "pm.run(broken)", lambda p, c: next(answers), timeout=120)
    assert failed.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "], (failed.text, failed.error)
    assert "\n101\n" in failed.text and failed.error is not None, failed
    assert "rank 1 broke" in failed.error["evalue"], failed.error
    assert _run(kernel, "pm.close()", timeout=60).error is None
    assert_nothing_left(cluster)
