"""``pool.debug()`` on a cluster pool, typed at in a real kernel's cell: the failed rank's
post-mortem prompt comes home from its node as a breakpoint's does.

A Dask ``LocalCluster`` of two worker processes, one rank on each node (made here, so what is
left under its workers can be counted).
"""

from __future__ import annotations

import pytest

from tests.kernel_cells import real_kernel
from tests.optional import needs
from tests.test_cluster_integration import assert_nothing_left, local_cluster
from tests.test_debugger_kernel_integration import _run
from tests.test_post_mortem_kernel_integration import FAILING_CELL, _typed

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    needs("distributed", what="cluster pools"),
]


def test_pool_debug_on_a_cluster_pool_opens_rank_1_on_its_node():
    pool = (
        "from distributed import Client\n"
        "from notebook_kit import WorkerPool\n"
        "client = Client({address!r})\n"
        "pool = WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False)"
    )
    with local_cluster() as cluster, real_kernel() as (_, client):
        assert _run(client, pool.format(address=cluster.scheduler.address)).error is None
        failed = _run(client, f"pool.run_cell({FAILING_CELL.format(first=1)!r})")
        assert failed.error is not None and "ZeroDivisionError" in failed.error["evalue"]
        debugged = _run(client, "pool.debug()", _typed("p x", "q"), timeout=120)
        assert debugged.error is None, debugged
        assert debugged.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "], debugged
        assert "\n15\n" in debugged.text, debugged.text  # rank 1's x, on node 1
        again = _run(client, "print('again', pool.run_cell('x'))")
        assert again.error is None and "again 5" in again.text, again
        _run(client, "pool.close()")
        assert_nothing_left(cluster)
