"""multiprocessing objects made in the kernel work in the forked workers, as in its own children.

Scripts written for ``torch.multiprocessing`` (Accelerate's fault-tolerance example among them)
hand a ``multiprocessing.Queue`` made before the launch to their workers. A fork copies the
queue as it is, with its internal lock held if one of the kernel's threads held it then.
"""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch.distributed as dist

from notebook_kit import notebook_launcher

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


class _SlowToPickle:
    """Pickled by the queue's feeder thread, after put() has returned: the worker has ended by
    then unless, as a multiprocessing child does, it waits for its queues to be flushed."""

    def __reduce__(self):
        time.sleep(0.5)
        return (str, ("delivered",))


def _put_rank(queue):
    queue.put((dist.get_rank(), _SlowToPickle()))
    return "put"


@pytest.mark.timeout(120)
def test_a_queue_locked_at_the_fork_takes_each_ranks_put_and_delivers_it():
    queue = multiprocessing.get_context("fork").Queue()
    with queue._notempty:  # as the kernel's feeder thread holds it while it writes
        result = notebook_launcher(
            _put_rank, args=(queue,), num_processes=2, live=False, timeout=30
        )
    assert result == "put"
    got = sorted(queue.get(timeout=10) for _ in range(2))
    assert got == [(0, "delivered"), (1, "delivered")]
    queue.close()
    queue.join_thread()
