"""notebooks/08_cluster runs top to bottom in a real kernel, on a LocalCluster of 2 nodes."""

from __future__ import annotations

import time

import pytest

from tests.optional import needs
from tests.processes import child_subreaper, descendants, kill_and_reap
from tests.test_scale_out_notebooks import _execute

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    needs("distributed", what="the cluster notebook"),
]

# Python's multiprocessing starts one resource tracker per process that uses spawn (Dask's
# LocalCluster does); it ends only when the kernel has ended, so it is adopted here and shows
# as a zombie. Dead processes are reaped; any process still alive is a leftover.


def test_cluster_notebook(tmp_path):
    before = {child.pid for child in descendants()}
    with child_subreaper():
        texts, _seconds = _execute("08_cluster.ipynb", tmp_path)
        deadline = time.monotonic() + 5.0
        while True:
            left = [p for p in descendants() if p.pid not in before]
            left = [p for p in left if _alive(p)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        kill_and_reap(descendants())
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"
    shown = "\n".join(texts)
    assert "2 Dask workers" in shown
    kernel = float(shown.split("accuracy of the trained model in this kernel: ")[1].split("%")[0])
    returned = float(shown.split("accuracy returned by rank 0: ")[1].split("%")[0])
    assert kernel > 80 and returned > 80  # the weights came home
    assert "loss over 10 epochs, mean of both nodes" in shown
    # %%distributed cells on the cluster's nodes, each rank's lines under its rank and node
    assert "Started a pool for %%distributed cells: 1 process on each of 2 Dask workers" in shown
    assert "[rank 1 · node 1]\nrank 1 of 2 on" in shown and "sum of ranks + 1 is 3" in shown
    assert "[rank 0 · node 0]\nrank 0 still holds total = 3" in shown, shown


def _alive(process) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
