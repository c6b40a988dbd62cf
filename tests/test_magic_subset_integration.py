"""A cell on some ranks only (``%%distributed --ranks``), on real forked workers and Dask nodes.

What a subset cell leaves the other ranks (nothing run, state kept), what it ships (a kernel
value sent to some ranks is sent again to the rest later), and the hang it can cause: a
collective of all ranks inside it waits for ranks that were never asked, which the pool's stall
report names. And a cell run on a thread of its own (``--noblock``), which the kernel's Ctrl-C
never reaches, interrupted through its view instead.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from notebook_kit import WorkerPool
from notebook_kit.launch.pool.view import interrupt_with
from tests.optional import needs

pytestmark = pytest.mark.integration

SETUP = "import torch.distributed as dist\nrank = dist.get_rank()\ncount = 0"
SPIN = "import time\nwhile True:\n    time.sleep(0.01)"


def _interrupted_in_the_background(pool: WorkerPool) -> BaseException | None:
    """Run a cell that never ends on a thread, as a --noblock cell runs; interrupt it there."""
    request, ended = threading.Event(), []

    def background() -> None:
        interrupt_with(request)
        try:
            pool.run_cell(SPIN)
        except BaseException as error:
            ended.append(error)

    thread = threading.Thread(target=contextvars.copy_context().run, args=(background,))
    thread.start()
    time.sleep(1.5)
    request.set()
    thread.join(30)
    assert not thread.is_alive(), "the interrupt did not end the background cell"
    return ended[0] if ended else None


@pytest.fixture
def pool(no_leftover_processes: None) -> Iterator[WorkerPool]:
    shared = WorkerPool(num_processes=3, live=False, stall_seconds=1.0, timeout=6.0)
    shared.run_cell(SETUP)
    yield shared
    shared.close()


def test_a_subset_runs_alone_and_returns_its_ranks_values(pool: WorkerPool) -> None:
    assert pool.run_cell("count += 1\nrank", ranks=[2, 1]) == 1
    assert pool.run_cell("count += 1\nrank * 10", ranks=[2], every=True) == {2: 20}
    assert pool.run_cell("count", every=True) == {0: 0, 1: 1, 2: 2}
    with pytest.raises(ValueError, match="ranks must be >= 0 and <= 2, got 3"):
        pool.run_cell("count += 1", ranks=[3])
    with pytest.raises(ValueError, match="ranks is empty"):
        pool.run_cell("count += 1", ranks=[])
    assert pool.run_cell("count", every=True) == {0: 0, 1: 1, 2: 2}


def test_a_kernel_value_sent_to_some_ranks_reaches_the_others_later(pool: WorkerPool) -> None:
    main = sys.modules["__main__"]
    main.only_some = "from the kernel"
    try:
        assert pool.run_cell("only_some", ranks=[1]) == "from the kernel"
        assert pool.run_cell("only_some", every=True) == dict.fromkeys(range(3), "from the kernel")
    finally:
        del main.only_some


def test_a_collective_in_a_subset_cell_is_named_in_the_stall_report(
    pool: WorkerPool, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(TimeoutError):  # the barrier never returns: the pool's timeout ends it
        pool.run_cell("dist.barrier()", ranks=[1, 2])
    report = capfd.readouterr().out
    assert "rank 1: waiting in dist.barrier" in report, report
    assert "rank 0: not in a collective" in report
    assert "Rank 0 never joined: the others wait for it." in report
    assert pool.run_cell("import torch.distributed as dist\ndist.get_world_size()") == 3


def test_a_background_cell_is_interrupted_and_the_workers_keep_their_state(
    pool: WorkerPool,
) -> None:
    pids = pool.pids
    pool.run_cell("count = 7")
    assert isinstance(_interrupted_in_the_background(pool), KeyboardInterrupt)
    assert pool.run_cell("count", every=True) == dict.fromkeys(range(3), 7)
    assert pool.pids == pids


@needs("distributed", what="a subset cell on a cluster pool")
def test_a_subset_or_background_cell_on_a_cluster_pool() -> None:
    from tests.test_cluster_integration import assert_nothing_left, local_cluster

    with local_cluster() as client:
        with WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False) as nodes:
            nodes.run_cell(SETUP)
            assert nodes.run_cell("count += 5\nrank", ranks=[1], every=True) == {1: 1}
            assert nodes.run_cell("count", every=True) == {0: 0, 1: 5}
            assert isinstance(_interrupted_in_the_background(nodes), KeyboardInterrupt)
            assert nodes.run_cell("count", every=True) == {0: 0, 1: 5}
        assert_nothing_left(client)
